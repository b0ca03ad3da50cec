"""Sampling micro-benchmark: the PyTorch chain (``draw_reference``) vs the fused kernels (``draw``).

    PYTHONPATH=. python benchmarks/kernels/sampling.py --out DIR [--batches 1,8,32]

Per case and batch B: kernels per draw (torch.profiler over one eager draw; the parameters'
uploads are built before and not counted), us per draw eager (host launches included; median of
5 timings of 20 draws) and replayed from one CUDA graph of 16 draws (the talker frame's form,
every ``BatchParams`` field present as in the frame graph). ``first_call_s``: the case's first
fused draw in this process (the Triton compile with a cold cache; a fresh machine has one).
Writes sampling.json and sampling.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[i]) for i in (2, 1)]  # the repository root, benchmarks/
from harness import graph_call_us, int_list, markdown_table, write_report  # noqa: E402

from omniwalk.sampling import BatchParams, SamplerState, SamplingParams, draw, draw_reference  # noqa: E402

# name -> (vocab, logits dtype, per-request parameters as served)
THINKER_FILTERED = {"temperature": 0.7, "top_k": 20, "top_p": 0.8, "repetition_penalty": 1.1}
CASES = {
    "code predictor": (2048, torch.bfloat16, {"temperature": 1.0, "top_k": 50, "top_p": 0.8}),
    "talker group 0": (3072, torch.float32, {"temperature": 0.9, "top_k": 50, "repetition_penalty": 1.05}),
    "thinker plain": (152064, torch.bfloat16, {"temperature": 1.0}),
    "thinker filtered": (152064, torch.bfloat16, THINKER_FILTERED),
}


def batch_params(vocab: int, kwargs: dict, batch: int) -> BatchParams:
    prompt = list(range(0, vocab, 97))
    states = [SamplerState(SamplingParams(seed=i, **kwargs), (), prompt) for i in range(batch)]
    return BatchParams.of(states, vocab, "cuda")


def eager_us(fn) -> float:
    for _ in range(3):
        fn(0)
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(20):
            fn(i)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / 20)
    return statistics.median(times)


def kernels_per_draw(fn) -> int | None:
    from torch.profiler import ProfilerActivity, profile

    fn(0)
    torch.cuda.synchronize()
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn(0)
            torch.cuda.synchronize()
    except (RuntimeError, AssertionError) as e:  # (no CUPTI / no CUDA activity)
        print(f"profiler: {e}", file=sys.stderr)
        return None
    cuda = torch.autograd.DeviceType.CUDA
    return sum(1 for e in prof.events() if e.device_type == cuda and not e.name.startswith(("Memcpy", "Memset")))


def measure(name: str, batch: int) -> dict:
    vocab, dtype, kwargs = CASES[name]
    logits = torch.randn(batch, vocab, device="cuda").mul_(3).to(dtype)
    eager = batch_params(vocab, kwargs, batch)
    full = eager.with_all_fields(vocab)
    row = {"case": name, "vocab": vocab, "batch": batch}
    start = time.perf_counter()
    draw(logits, eager)
    torch.cuda.synchronize()
    row["first_call_s"] = time.perf_counter() - start
    for label, fn in (("before", draw_reference), ("after", draw)):
        row[f"kernels_{label}"] = kernels_per_draw(lambda i, fn=fn: fn(logits, eager, i))
        row[f"eager_us_{label}"] = eager_us(lambda i, fn=fn: fn(logits, eager, i))
        row[f"graph_us_{label}"] = graph_call_us(lambda i, fn=fn: fn(logits, full, i), 16, replays=20)
    print(row, flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batches", type=int_list, default=[1, 8, 32])
    args = parser.parse_args()
    rows = [measure(name, batch) for name in CASES for batch in args.batches]
    keys = ["kernels_before", "kernels_after", "eager_us_before", "eager_us_after", "graph_us_before", "graph_us_after"]
    table = markdown_table(
        ["case", "V", "B", *keys, "first_call_s"],
        [[r["case"], r["vocab"], r["batch"], *[r[k] for k in keys], r["first_call_s"]] for r in rows],
    )
    write_report(args.out, "sampling", {"device": torch.cuda.get_device_name(), "rows": rows}, table + "\n")
    print(table)


if __name__ == "__main__":
    main()
