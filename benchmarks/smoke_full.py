"""First full-size end-to-end run on one GPU: random bf16 weights built on the device.

    python benchmarks/smoke_full.py SKELETON_DIR      # from `omniwalk make-tiny DIR --config REAL --no-weights`

Times, through ``Omni`` (the engine, no HTTP): t2t at B=1 (64 tokens, per-token latency),
t2t at B=8, and t2s at B=1 (40 tokens + 50 frames = 4 s of speech, real-time factor).
"""

import sys
import time

import torch

from omniwalk import Omni


def timed(omni: Omni, requests):
    torch.cuda.synchronize()
    start = time.perf_counter()
    outs = omni.generate(requests)
    torch.cuda.synchronize()
    return outs, time.perf_counter() - start


# The full-size model with random bf16 weights on the GPU, fused MoE, 8 + 2 GiB of KV.
FULL_OPTIONS = dict(
    device="cuda",
    dtype="bfloat16",
    moe_backend="fused",
    random_weights=True,
    thinker_kv_bytes=8 * 2**30,
    talker_kv_bytes=2 * 2**30,
)


def build_full(skeleton: str, **overrides) -> Omni:
    """``Omni`` with ``FULL_OPTIONS``; ``overrides`` are further ``Omni`` options (e.g. from micro.py)."""
    return Omni(model=skeleton, **{**FULL_OPTIONS, **overrides})


def main(skeleton: str) -> None:
    start = time.perf_counter()
    omni = build_full(skeleton)
    print(f"built in {time.perf_counter() - start:.1f}s, GPU memory {torch.cuda.memory_allocated() / 2**30:.1f} GiB")
    text = {"messages": [{"role": "user", "content": "hello"}], "ignore_eos": True, "temperature": 0.0}
    timed(omni, {**text, "max_tokens": 4})  # warm-up
    times = {}
    for n in (16, 64):
        out, times[n] = timed(omni, {**text, "max_tokens": n})
        print(f"t2t B=1 {n} tokens: {times[n]:.3f}s end to end ({len(out.prompt_token_ids)}-token prompt)")
    print(f"t2t B=1 inter-token latency ≈ {(times[64] - times[16]) / 48 * 1000:.2f} ms (64 vs 16 tokens)")
    for b in (8, 32):
        outs, seconds = timed(omni, [{**text, "max_tokens": 64, "seed": i} for i in range(b)])
        print(f"t2t B={b} x 64 tokens: {seconds:.3f}s, {b * 64 / seconds:.1f} tok/s")
    speech = {
        **text,
        "max_tokens": 40,
        "modalities": ["text", "audio"],
        "talker_temperature": 0.0,
        "code_predictor_temperature": 0.0,
        "min_audio_frames": 50,
        "max_audio_frames": 50,
    }
    timed(omni, {**speech, "max_tokens": 4, "min_audio_frames": 5, "max_audio_frames": 5})
    for b in (1, 8):
        outs, seconds = timed(omni, [speech] * b)
        audio_s = outs[0].audio.numel() / 24000
        print(
            f"t2s B={b} 40 tokens + {outs[0].codes.shape[0]} frames ({audio_s:.2f}s audio each): {seconds:.3f}s, "
            f"RTF {seconds / audio_s:.3f}"
        )
    print("stats:", {k: v for k, v in omni.engine.stats().items() if k in ("thinker", "talker")})


if __name__ == "__main__":
    main(sys.argv[1])
