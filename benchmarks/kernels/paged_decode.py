"""Stand-alone paged decode attention timings on the GPU: µs per call vs batch, context and the
kernel's block variants, with and without rows split over programs; what it measures sets the tuned
configuration ``omniwalk/kernels/configs/paged_decode,device_name=<GPU>.json`` and ``DECODE_PROGRAMS``.

    PYTHONPATH=. python benchmarks/kernels/paged_decode.py --out DIR

Each figure: one CUDA graph running the kernel for ``--layers`` layers, each over its own keys
and values (pages shuffled), replayed; µs per call. The table is as wide as a 2,080-key context
whatever the rows' lengths (a graph's table is as wide as the pool), so the split count is the
one a captured step would use.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from omniwalk.kernels.paged_decode import DECODE_BLOCKS, DECODE_PROGRAMS, num_splits, paged_decode_triton

sys.path.insert(0, str(Path(__file__).resolve().parent))  # (fused_moe.py beside this file)
from fused_moe import time_us  # noqa: E402

SHAPES = {  # name: (heads, kv heads, page size, contexts); the code predictor: one page per row of 17 keys
    "thinker": (32, 4, 16, [17, 130, 207, 512, 2048]),
    "talker": (16, 2, 16, [17, 130, 512]),
    "code_predictor": (16, 8, 17, [3, 17]),
}
BLOCKS = [DECODE_BLOCKS, (32, 4), (128, 8)]
PROGRAMS = [0, DECODE_PROGRAMS, 2 * DECODE_PROGRAMS]  # 0: rows not split (no semaphores)
WIDTH = 130  # table columns (pages) per row


def layer_inputs(heads: int, kv_heads: int, page: int, batch: int, context: int, layers: int):
    d, pages_per_row = 128, -(-context // page)
    out = []
    for _ in range(layers):
        num_pages = batch * pages_per_row
        keys = torch.randn((num_pages + 1) * page, kv_heads, d, device="cuda", dtype=torch.bfloat16)
        table = torch.zeros(batch, WIDTH, dtype=torch.int32, device="cuda")
        table[:, :pages_per_row] = torch.randperm(num_pages, device="cuda").view(batch, pages_per_row).int()
        out.append(
            (torch.randn(batch, heads, d, device="cuda", dtype=torch.bfloat16), keys, torch.randn_like(keys), table)
        )
    return out, torch.full((batch,), context, dtype=torch.int32, device="cuda")


@torch.inference_mode()
def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batches", default="1,8,32")
    args = p.parse_args()
    semaphores = torch.zeros(2 * DECODE_PROGRAMS, dtype=torch.int32, device="cuda")
    rows = []
    for name, (heads, kv_heads, page, contexts) in SHAPES.items():
        width = WIDTH if page == 16 else 1
        for batch in [int(b) for b in args.batches.split(",")]:
            for context in contexts:
                inputs, lens = layer_inputs(heads, kv_heads, page, batch, context, args.layers)
                inputs = [(q, k, v, t[:, :width].contiguous()) for q, k, v, t in inputs]
                for blocks in BLOCKS:
                    for programs in PROGRAMS if page == 16 else [0]:
                        sem = semaphores if programs else None

                        def run(blocks=blocks, programs=programs, sem=sem):
                            for q, k, v, t in inputs:
                                paged_decode_triton(q, k, v, t, lens, page, sem, blocks, programs or DECODE_PROGRAMS)

                        us = time_us(run, args.layers)
                        splits = num_splits(batch * kv_heads, width * page, blocks[0], programs) if programs else 1
                        rows.append(
                            dict(
                                shape=name,
                                batch=batch,
                                context=context,
                                blocks=blocks,
                                programs=programs,
                                splits=splits,
                                us=us,
                            )
                        )
                        print(
                            f"{name:14s} B={batch:2d} keys={context:4d} blocks={blocks} programs={programs:3d} "
                            f"splits={splits}: {us:6.2f} µs",
                            flush=True,
                        )
            torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "paged_decode.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
