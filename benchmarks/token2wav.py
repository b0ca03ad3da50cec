"""Cost of Qwen2.5-Omni token2wav per second of streamed audio: the DiT's RK step and BigVGAN.

Full-size token2wav (the 7B checkpoint's ``token2wav_config``: HF's defaults), random weights,
fp32 (as HF runs token2wav). The streamed shapes (``token2wav_stream.py``, 3-block chunks):

    DiT    one batched RK step (4 guided evaluations, 2 CFG rows each) over ``--rows`` middle
           windows of P + C + F = 144 frames; a window keeps C = 72 frames (0.72 s) after
           ``num_steps - 1`` = 9 such steps
    BigVGAN  one middle vocoder span: C + 2V frames decoded (V = its receptive field, 38), C kept

Reported per second of audio (100 mel frames) for one stream and per row of a batch, beside the
multiply-accumulates counted with forward hooks (Linear / Conv1d / ConvTranspose1d, plus attention
scores over the visible keys) and the rate they imply. Usage:

    python benchmarks/token2wav.py [--rows 1 4] [--repeats 3] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch
from torch import nn

from omniwalk.models.qwen2_5_omni.networks.bigvgan import BigVGANConfig
from omniwalk.models.qwen2_5_omni.networks.dit import Attention, DiTConfig, block_masks
from omniwalk.models.qwen2_5_omni.networks.token2wav import Token2Wav, Token2WavConfig, ode_times, rk38_step
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
        total += 2 * int(inputs[2].sum()) * module.num_heads * module.head_dim  # QK^T and PV, visible keys

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
    audio_s = plan.chunk / FRAMES_PER_SECOND  # kept per window
    per_audio_s = seconds * (cfg.flow.num_steps - 1) / (rows * audio_s)
    return {"rows": rows, "frames": frames, "step_s": seconds, "gmacs_per_step": macs / 1e9,
            "gmac_per_s": macs / 1e9 / seconds, "dit_s_per_audio_s_per_row": per_audio_s}  # fmt: skip


@torch.inference_mode()
def measure_bigvgan(model: Token2Wav, plan: StreamPlan, repeats: int, device) -> dict:
    frames = plan.chunk + 2 * plan.vocoder_context
    mel = torch.randn(1, model.cfg.bigvgan.mel_dim, frames, device=device) - 4

    def decode():
        return model.bigvgan(mel)

    seconds = timed(decode, repeats, device)
    macs = count_macs(model.bigvgan, decode)
    return {"span_frames": frames, "kept_frames": plan.chunk, "span_s": seconds, "gmacs_per_span": macs / 1e9,
            "gmac_per_s": macs / 1e9 / seconds,
            "bigvgan_s_per_audio_s": seconds * FRAMES_PER_SECOND / plan.chunk}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    cfg = Token2WavConfig(DiTConfig(), BigVGANConfig())
    with torch.device(device):
        model = Token2Wav(cfg).eval()
    plan = StreamPlan.build(cfg)
    report = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "threads": torch.get_num_threads(),
        "num_steps": cfg.flow.num_steps,
        "dit": [measure_dit(model, plan, rows, args.repeats, device) for rows in args.rows],
        "bigvgan": measure_bigvgan(model, plan, args.repeats, device),
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
