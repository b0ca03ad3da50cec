"""Stand-alone LoRA delta timings on the GPU: µs per ``add_lora`` call (Triton kernels and the PyTorch
reference) beside the base projection it follows (``F.linear``), for the thinker's projections of both
families, decode and prefill row counts, ranks 16 and 64, adapters mixed over the rows.

    PYTHONPATH=. python benchmarks/kernels/lora.py --out DIR [--ranks 16,64] [--rows 1,8,32,64,512,4096]

Each figure: one CUDA graph calling the op for ``--layers`` layers, each with its own weights (so the
weights come from HBM as in a forward), replayed; µs per call. Rows: decode row counts (<= 64) take
their slots at random over the pool's adapters and the base (-1); prefill row counts take contiguous
runs of one adapter per request of 512 rows, as a packed prefill chunk does. Before timing, each Triton
result is checked against the reference (max abs difference printed). Up to ``ROW_KERNEL_MAX_ROWS`` rows the
tiled kernels are timed too (``tiled_us``), for the choice of that limit.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from omniwalk.kernels import lora as lora_kernels
from omniwalk.lora.ops import add_lora

sys.path.insert(0, str(Path(__file__).resolve().parent))  # (fused_moe.py beside this file)
from fused_moe import time_us  # noqa: E402

SHAPES = {  # projection: (in, out)
    "qwen3_omni_30b.qkv": (2048, 5120),
    "qwen3_omni_30b.q": (2048, 4096),
    "qwen3_omni_30b.kv": (2048, 512),
    "qwen3_omni_30b.o": (4096, 2048),
    "qwen2_5_omni_7b.q": (3584, 3584),
    "qwen2_5_omni_7b.o": (3584, 3584),
    "qwen2_5_omni_7b.gate": (3584, 18944),
    "qwen2_5_omni_7b.down": (18944, 3584),
}
REQUEST_ROWS = 512  # a prefill request's rows (contiguous, one adapter)


def row_slots(m: int, num_slots: int, gen: torch.Generator) -> torch.Tensor:
    if m <= 64:  # a decode batch: each row its request's adapter, or the base
        slots = torch.randint(-1, num_slots, (m,), generator=gen)
    else:
        per_request = torch.randint(-1, num_slots, (-(-m // REQUEST_ROWS),), generator=gen)
        slots = per_request.repeat_interleave(REQUEST_ROWS)[:m]
    return slots.to(torch.int32).cuda()


def measure(name: str, n_in: int, n_out: int, m: int, rank: int, num_slots: int, layers: int) -> dict:
    gen = torch.Generator().manual_seed(m)
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    weights = [torch.randn(n_out, n_in, **bf16) / n_in**0.5 for _ in range(layers)]
    pools = [
        (torch.randn(num_slots, rank, n_in, **bf16) / n_in**0.5, torch.randn(num_slots, n_out, rank, **bf16) / rank)
        for _ in range(layers)
    ]
    x, slots = torch.randn(m, n_in, **bf16), row_slots(m, num_slots, gen)
    y = torch.randn(m, n_out, **bf16)
    ours, ref = y.clone(), y.clone()
    add_lora(ours, x, *pools[0], slots, backend="triton")
    add_lora(ref, x, *pools[0], slots, backend="reference")
    error = (ours.float() - ref.float()).abs().max().item()
    row = dict(shape=name, n_in=n_in, n_out=n_out, rows=m, rank=rank, slots=num_slots, max_abs_error=error)
    row["base_us"] = time_us(lambda: [F.linear(x, w) for w in weights], layers)
    for backend in ("triton", "reference"):
        row[f"{backend}_us"] = time_us(lambda b=backend: [add_lora(y, x, a, bb, slots, b) for a, bb in pools], layers)
    if m <= lora_kernels.ROW_KERNEL_MAX_ROWS:  # the tiled kernels at decode sizes too, for the choice of the limit
        limit, lora_kernels.ROW_KERNEL_MAX_ROWS = lora_kernels.ROW_KERNEL_MAX_ROWS, 0
        row["tiled_us"] = time_us(lambda: [add_lora(y, x, a, bb, slots, "triton") for a, bb in pools], layers)
        lora_kernels.ROW_KERNEL_MAX_ROWS = limit
    return row


@torch.inference_mode()
def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--ranks", default="16,64")
    p.add_argument("--rows", default="1,8,32,64,512,4096")
    p.add_argument("--shapes", default=",".join(SHAPES))
    args = p.parse_args()
    results = []
    for name in args.shapes.split(","):
        n_in, n_out = SHAPES[name]
        for rank in [int(r) for r in args.ranks.split(",")]:
            for m in [int(r) for r in args.rows.split(",")]:
                row = measure(name, n_in, n_out, m, rank, args.slots, args.layers)
                results.append(row)
                print(
                    f"{name:22s} r={rank:2d} M={m:5d}: base {row['base_us']:8.2f} µs  triton {row['triton_us']:7.2f} "
                    f"({row['triton_us'] / row['base_us']:5.2f}x base)  reference {row['reference_us']:8.2f}  "
                    f"tiled {row.get('tiled_us', float('nan')):7.2f}  err {row['max_abs_error']:.3g}",
                    flush=True,
                )
            torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    device = dict(device_name=torch.cuda.get_device_name(), command=" ".join(sys.argv))
    (args.out / "lora.json").write_text(json.dumps(dict(**device, results=results), indent=1))


if __name__ == "__main__":
    main()
