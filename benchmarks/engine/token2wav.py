"""Cost of Qwen2.5-Omni token2wav per second of streamed audio: the DiT's RK step and BigVGAN.

Full-size token2wav (the 7B checkpoint's ``token2wav_config``: HF's defaults), random weights,
fp32 (as HF runs token2wav). The streamed shapes (``token2wav_stream.py``, 3-block chunks):

    DiT    one batched RK step (4 guided evaluations, 2 CFG rows each) over ``--rows`` middle
           windows of P + C + F = 144 frames; a window keeps C = 72 frames (0.72 s) after
           ``num_steps - 1`` = 9 such steps
    BigVGAN  one middle vocoder span: C + 2V frames decoded (V = its receptive field, 38), C kept

Reported per second of audio (100 mel frames) for one stream and per row of a batch, beside the
multiply-accumulates counted with forward hooks (Linear / Conv1d / ConvTranspose1d, plus attention
scores over the visible keys) and the rate they imply, for each variant: the DiT's layers in each of
``--dit-dtypes`` (``DiT.run_in``: a bf16 model's; the ODE state and BigVGAN stay fp32) on each of
``--paths``: ``reference`` (the PyTorch modules as built) and, on CUDA, ``fast`` (what the server runs:
``use_kernels(token2wav, "fused")``, ``DiT.merge_projections``). On CUDA also the kernels of one RK
step and its time replayed from a CUDA graph (``graph_step_s``: the served step is graphed; the per-second-
of-audio figure then uses it). Then the
accuracy of each variant against the fp32 reference: one-shot decodes of ``--accuracy-codes`` random
codes with random audible weights (``audible_token2wav``), waveform cosine and SNR. Usage:

    python benchmarks/engine/token2wav.py [--rows 1 4] [--repeats 3] [--device cpu] [--accuracy-codes 96]
    python benchmarks/engine/token2wav.py --device cuda --rows 1 32 --dit-dtypes bfloat16 --paths reference fast
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ (harness.py)
from harness import replay_us  # noqa: E402
from micro_clock import count_kernels  # noqa: E402

from omniwalk.layers.decoder import use_kernels
from omniwalk.models.qwen2_5_omni.checkpoint.tiny import audible_token2wav
from omniwalk.models.qwen2_5_omni.networks.bigvgan import BigVGANConfig
from omniwalk.models.qwen2_5_omni.networks.dit import Attention, DiTConfig, block_masks
from omniwalk.models.qwen2_5_omni.networks.token2wav import (
    Token2Wav,
    Token2WavConfig,
    initial_noise,
    ode_times,
    rk38_step,
)
from omniwalk.models.qwen2_5_omni.networks.token2wav_stream import StreamPlan

FRAMES_PER_SECOND = 100  # 24 kHz / 240 samples per mel frame


def count_macs(model: nn.Module, run) -> int:
    total = 0

    def layer_hook(module, inputs, output):
        nonlocal total
        if isinstance(module, nn.Linear):
            total += output.numel() * module.in_features
        else:
            total += output.numel() * module.in_channels // module.groups * module.kernel_size[0]

    def attention_hook(module, inputs, output):
        nonlocal total
        mask = inputs[2]  # (bool, or additive on the fast path)
        visible = mask.sum() if mask.dtype == torch.bool else (mask == 0).sum()
        total += 2 * int(visible) * module.num_heads * module.head_dim  # QK^T and PV, visible keys

    kinds = (nn.Linear, nn.Conv1d, nn.ConvTranspose1d)
    handles = [m.register_forward_hook(layer_hook) for m in model.modules() if isinstance(m, kinds)]
    handles += [m.register_forward_hook(attention_hook) for m in model.modules() if isinstance(m, Attention)]
    run()
    for h in handles:
        h.remove()
    return total


def timed(run, repeats: int, device) -> float:
    """Median seconds of ``run()`` after one warm-up call."""
    run()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.inference_mode()
def measure_dit(model: Token2Wav, plan: StreamPlan, rows: int, repeats: int, device) -> dict:
    cfg = model.cfg
    frames = plan.back + plan.chunk + plan.ahead
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, cfg.dit.num_embeds, (frames // plan.repeats,), generator=g).to(device)
    speaker = model.speaker_rows(
        torch.randn(cfg.dit.enc_emb_dim, device=device), torch.randn(300, cfg.dit.mel_dim, device=device)
    )
    one = model.dit.condition_rows(speaker, codes)
    conditions = torch.cat([one[:1].expand(rows, -1, -1), one[1:].expand(rows, -1, -1)])
    masks = block_masks(cfg.dit, [frames] * 2 * rows, frames, device)
    x = torch.randn(rows, frames, cfg.dit.mel_dim, device=device)
    times = ode_times(cfg.flow.num_steps, cfg.flow.sway_coefficient, device)
    t0, t1 = times[3].expand(rows), times[4].expand(rows)

    def step():
        return rk38_step(lambda t, h: model.dit.velocity(h, t, conditions, masks, cfg.flow.guidance_scale), t0, t1, x)

    seconds = timed(step, repeats, device)
    macs = count_macs(model.dit, step)
    out = {
        "rows": rows,
        "frames": frames,
        "step_s": seconds,
        "gmacs_per_step": macs / 1e9,
        "gmac_per_s": macs / 1e9 / seconds,
    }
    if device.type == "cuda":
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        seconds = replay_us(graph, max(repeats, 5)) / 1e6
        out.update(
            kernels_per_step=count_kernels(step, device), graph_step_s=seconds, graph_gmac_per_s=macs / 1e9 / seconds
        )
    audio_s = plan.chunk / FRAMES_PER_SECOND  # kept per window
    out["dit_s_per_audio_s_per_row"] = seconds * (cfg.flow.num_steps - 1) / (rows * audio_s)
    return out


@torch.inference_mode()
def measure_bigvgan(model: Token2Wav, plan: StreamPlan, repeats: int, device) -> dict:
    frames = plan.chunk + 2 * plan.vocoder_context
    mel = torch.randn(1, model.cfg.bigvgan.mel_dim, frames, device=device) - 4

    def decode():
        return model.bigvgan(mel)

    seconds = timed(decode, repeats, device)
    macs = count_macs(model.bigvgan, decode)
    return {
        "span_frames": frames,
        "kept_frames": plan.chunk,
        "span_s": seconds,
        "gmacs_per_span": macs / 1e9,
        "gmac_per_s": macs / 1e9 / seconds,
        "bigvgan_s_per_audio_s": seconds * FRAMES_PER_SECOND / plan.chunk,
    }


@torch.inference_mode()
def accuracy(model: Token2Wav, voice: dict, others: dict[str, Token2Wav], num_codes: int, device) -> list[dict]:
    """One-shot decodes (the checkpoint's steps) with the audible weights: each variant vs the fp32 reference."""
    cfg = model.cfg.dit
    speaker = model.speaker_rows(*(voice[k].to(device) for k in ("cond", "ref_mel")))
    rows = []
    for name, other in others.items():
        for seed in (1, 2):
            codes = torch.randint(0, cfg.num_embeds, (num_codes,), generator=torch.Generator().manual_seed(seed))
            noise = initial_noise(seed, num_codes * cfg.repeats, cfg.mel_dim, device)
            ref, out = (m(codes.to(device), speaker, noise) for m in (model, other))
            rows.append(
                {
                    "variant": name,
                    "seed": seed,
                    "codes": num_codes,
                    "wave_cosine": torch.nn.functional.cosine_similarity(ref.double(), out.double(), dim=0).item(),
                    "snr_db": (10 * torch.log10(ref.pow(2).sum() / (ref - out).pow(2).sum())).item(),
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dit-dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument(
        "--paths", nargs="+", default=None, choices=["reference", "fast"], help="[reference, and fast on CUDA]"
    )
    parser.add_argument("--accuracy-codes", type=int, default=96, help="codes a compared decode speaks (0 = none)")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    cfg = Token2WavConfig(DiTConfig(), BigVGANConfig())
    with torch.device(device):
        model = Token2Wav(cfg).eval()
    g = torch.Generator().manual_seed(3)
    voice = {
        "cond": torch.randn(1, cfg.dit.enc_emb_dim, generator=g),
        "ref_mel": torch.randn(1, 30, cfg.dit.mel_dim, generator=g) - 4,
    }
    if args.accuracy_codes:  # (the accuracy's weights, before the variants copy them; timings do not depend on them)
        audible_token2wav(model, voice, 0)
    paths = args.paths or (["reference", "fast"] if device.type == "cuda" else ["reference"])
    models = {}
    for dtype in args.dit_dtypes:
        for path in paths:
            variant = copy.deepcopy(model)
            variant.dit.run_in(getattr(torch, dtype))
            if path == "fast":
                use_kernels(variant, "fused")
            models[f"{dtype} {path}"] = variant
    plan = StreamPlan.build(cfg)
    report = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "threads": torch.get_num_threads(),
        "num_steps": cfg.flow.num_steps,
        "dit": [
            {"variant": name, **measure_dit(m, plan, rows, args.repeats, device)}
            for name, m in models.items()
            for rows in args.rows
        ],
        "bigvgan": measure_bigvgan(model, plan, args.repeats, device),
    }
    print(json.dumps(report, indent=1), flush=True)
    if args.accuracy_codes:
        others = {name: m for name, m in models.items() if name != "float32 reference"}
        report["accuracy"] = accuracy(model, voice, others, args.accuracy_codes, device)
        print(json.dumps(report["accuracy"], indent=1))


if __name__ == "__main__":
    main()
