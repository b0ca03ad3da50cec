"""Cost of a streamed vocoder chunk: stateful decode vs re-decoding with left context.

Full-size Code2Wav (the 30B-A3B checkpoint's ``code2wav_config``), random weights, fp32 by default.

    stateful   decode 25 new frames against the request's Code2WavState (steady state: the
               stream has already decoded ``--warm-frames`` frames)
    re-decode  what peers do: decode 25 context + 25 new frames from scratch, drop the first
               25·1920 samples (and lose the last 555 samples of every chunk)

Prediction: time follows multiply-accumulates, counted here with forward hooks on every
Linear / Conv1d / ConvTranspose1d (attention score MACs added separately); the ratio of the two
MAC counts is the predicted speed-up. Usage:

    python benchmarks/vocoder_stream.py [--config PATH] [--chunk 25] [--context 25] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from torch import nn

from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig
from omniwalk.models.qwen3_omni.checkpoint.tiny import PRESETS
from omniwalk.models.qwen3_omni.networks.code2wav import Code2Wav, WindowAttention
from omniwalk.models.qwen3_omni.networks.code2wav_stream import Code2WavState

DEFAULT_CONFIG = PRESETS["qwen3-omni-30b-a3b"]


def count_macs(vocoder: Code2Wav, run) -> int:
    """Multiply-accumulates of ``run()``: weight layers from their output shapes, plus attention."""
    total = 0

    def layer_hook(module, inputs, output):
        nonlocal total
        if isinstance(module, nn.Linear):
            total += output.numel() * module.in_features
        else:  # conv: every output sample reads in_channels / groups * kernel inputs
            total += output.numel() * module.in_channels // module.groups * module.kernel_size[0]

    def attention_hook(module, inputs, output):
        nonlocal total
        mask = inputs[3]
        total += 2 * int(mask.sum()) * module.num_heads * module.head_dim  # QK^T and PV over visible keys

    kinds = (nn.Linear, nn.Conv1d, nn.ConvTranspose1d)
    handles = [m.register_forward_hook(layer_hook) for m in vocoder.modules() if isinstance(m, kinds)]
    handles += [m.register_forward_hook(attention_hook) for m in vocoder.modules() if isinstance(m, WindowAttention)]
    run()
    for h in handles:
        h.remove()
    return total


def median_seconds(run, repeats: int) -> float:
    run()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--chunk", type=int, default=25, help="new frames per chunk")
    parser.add_argument("--context", type=int, default=25, help="left-context frames of the re-decode baseline")
    parser.add_argument("--warm-frames", type=int, default=100, help="frames the stream decoded before the chunk")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    torch.set_flush_denormal(True)  # random weights can underflow; keep timings about the real math
    torch.manual_seed(0)
    cfg = Qwen3OmniConfig.from_hf(json.loads(args.config.read_text())).code2wav
    vocoder = Code2Wav(cfg).eval()
    q = cfg.num_quantizers
    history = torch.randint(0, cfg.codebook_size, (1, args.warm_frames, q))
    chunk = torch.randint(0, cfg.codebook_size, (1, args.chunk, q))
    window = torch.cat([history[:, history.shape[1] - args.context :], chunk], dim=1)

    warm = vocoder.new_state()
    vocoder.decode(history, warm)

    def stateful():  # decode updates list entries and rebinds num_frames, so fresh lists keep `warm` intact
        state = Code2WavState(warm.num_frames, list(warm.keys), list(warm.values), list(warm.conv), list(warm.trans))
        return vocoder.decode(chunk, state)

    def redecode():
        return vocoder(window)[:, args.context * cfg.samples_per_frame :]

    macs = {"stateful": count_macs(vocoder, stateful), "re-decode": count_macs(vocoder, redecode)}
    secs = {"stateful": median_seconds(stateful, args.repeats), "re-decode": median_seconds(redecode, args.repeats)}
    samples = {"stateful": stateful().shape[-1], "re-decode": redecode().shape[-1]}

    machine = platform.processor() or platform.machine()
    params = sum(p.numel() for p in vocoder.parameters()) / 1e6
    print(f"machine: {machine}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"code2wav: {params:.1f} M params, fp32, sliding window {cfg.sliding_window}")
    print(f"chunk {args.chunk} new frames; re-decode context {args.context}; stream at frame {args.warm_frames}")
    print(f"{'mode':<10} {'GMAC':>8} {'ms':>9} {'GMAC/s':>8} {'samples':>8} {'audio ms':>9}")
    for mode in ("stateful", "re-decode"):
        gmacs, ms, n = macs[mode] / 1e9, secs[mode] * 1e3, samples[mode]
        print(f"{mode:<10} {gmacs:8.2f} {ms:9.1f} {gmacs / secs[mode]:8.1f} {n:8d} {n / 24:9.1f}")
    print(f"predicted speed-up (MAC ratio): {macs['re-decode'] / macs['stateful']:.2f}x")
    print(f"measured speed-up:              {secs['re-decode'] / secs['stateful']:.2f}x")


if __name__ == "__main__":
    main()
