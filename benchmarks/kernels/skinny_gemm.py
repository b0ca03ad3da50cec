"""The skinny GEMM vs cuBLAS on the decoders' projection shapes, per rows M and launch configuration;
with ``--tune`` it writes the GPU's tuned tiles, ``omniwalk/kernels/configs/skinny_gemm,device_name=<GPU>.json``
(``omniwalk/kernels/tuned.py``; entries of shapes not measured are kept).

    PYTHONPATH=. python benchmarks/kernels/skinny_gemm.py --out DIR [--rows 1,2,4,8,16,32] [--workers 12] [--tune]
    PYTHONPATH=. python benchmarks/kernels/skinny_gemm.py --apply DIR/tuned.json benchmarks/engine/micro.py ARGS...

Each figure: one CUDA graph of C calls over C copies of the weight (>= 512 MB in all, far more than
L2 holds, so each call reads its weight from HBM as a decode step does), replayed; µs per call,
the gap between two kernels of a graph included. cuBLAS is ``F.linear`` (+ the silu·mul kernel for
the gated product). Every configuration's output is checked against cuBLAS (the bound of
the GPU tests of ``tests/kernels/test_skinny_gemm.py``). Triton compiles first, in parallel worker processes (filling
Triton's disk cache). Writes skinny_gemm.json (every figure), skinny_gemm.md and tuned.json (per
table key the configuration with the least total time over its rows; the largest M where the
kernel beats cuBLAS on every decoder shape). ``--apply`` runs a script (e.g. micro.py) in this
process with that table in place, to measure it before ``--tune`` writes it into the package.
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import torch
import torch.nn.functional as F

from omniwalk.kernels import skinny_gemm as sg
from omniwalk.kernels import tuned as tuned_configs
from omniwalk.kernels.silu_mul import silu_mul_triton
from omniwalk.kernels.skinny_gemm import Blocks, padded_rows, skinny_gemm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ (harness.py)
from harness import graph_call_us, markdown_table  # noqa: E402

# name: (K, N, kind); partials: the consumer sums split-K parts (o_proj, down_proj); gated: N = 2I.
# One set per model whose decode shapes the table holds (``--shapes``); a set's heads are measured with --heads.
SHAPE_SETS = {
    "qwen3-omni": {
        "thinker qkv": (2048, 5120, "plain"),
        "thinker o": (4096, 2048, "partials"),
        "talker qkv": (1024, 2560, "plain"),
        "talker/cp o": (2048, 1024, "partials"),
        "cp qkv": (1024, 4096, "plain"),
        "cp gate_up": (1024, 6144, "gated"),
        "cp down": (3072, 1024, "partials"),
        "cp lm_head": (1024, 2048, "plain"),  # (heads: not on the fast path yet, for reference)
        "codec head": (1024, 3072, "plain"),
    },
    "qwen2.5-omni-7b": {  # dense thinker (hidden 3584, intermediate 18944) and talker (hidden 896)
        "thinker qkv": (3584, 4608, "plain"),
        "thinker o": (3584, 3584, "partials"),
        "thinker gate_up": (3584, 37888, "gated"),
        "thinker down": (18944, 3584, "partials"),
        "talker qkv": (896, 2560, "plain"),
        "talker o": (1536, 896, "partials"),
        "talker gate_up": (896, 37888, "gated"),
        "talker down": (18944, 896, "partials"),
        "thinker lm_head": (3584, 152064, "plain"),  # (cuBLAS on the fast path: for reference)
        "codec head": (896, 8448, "plain"),
    },
}
HEADS = ("cp lm_head", "codec head", "thinker lm_head")
SHAPES = SHAPE_SETS["qwen3-omni"]  # the set measured (main() sets it from --shapes)
# (at M = 1 the GEMV lanes beat tl.dot, the larger K steps best; at M > 1 deep pipelines of 64- or
# 32-row tiles; these are the leaders and their neighbours, incl. whole-K steps)
GEMV = [Blocks(8, 1024, 1, 4, 1), Blocks(16, 512, 1, 4, 1), Blocks(4, 2048, 1, 4, 1), Blocks(8, 2048, 1, 8, 1)]
GEMV += [Blocks(16, 1024, 1, 8, 1), Blocks(4, 4096, 1, 8, 1), Blocks(32, 256, 1, 4, 1), Blocks(16, 512, 1, 4, 3)]
# (the 7B's large products: 128 weights a thread in other shapes and depths)
GEMV += [Blocks(32, 512, 1, 8, 1), Blocks(16, 512, 1, 4, 2), Blocks(8, 1024, 1, 4, 2), Blocks(64, 256, 1, 8, 1)]
DOT = [Blocks(64, 256, 1, 4, 3), Blocks(32, 128, 1, 4, 6), Blocks(32, 256, 1, 4, 4), Blocks(64, 128, 1, 4, 6)]
DOT += [Blocks(32, 256, 1, 4, 6), Blocks(128, 128, 1, 4, 4), Blocks(64, 256, 1, 8, 3), Blocks(16, 256, 1, 4, 4)]
SPLITS = (1, 2, 4)
POOL_BYTES = 512 << 20
BF16 = torch.bfloat16


def candidates(m: int, kind: str, shape: tuple[int, int, str] | None = None) -> list[Blocks]:
    """The configurations measured at M = m; with ``shape`` (K, N, kind) also ``default_blocks``'s
    pick for it (what runs where the table has no key)."""
    base = GEMV + [b._replace(rows=16) for b in DOT[:2]] if m == 1 else DOT
    splits = SPLITS if kind == "partials" else (1,)
    out = [b._replace(split=s) for b in base for s in splits]
    if shape is not None:
        k, n, _ = shape
        gated = kind == "gated"
        default = sg.default_blocks(m, n // 2 if gated else n, k, kind == "partials", gated=gated)
        out += [default] if default not in out else []
    return out


def _warm(items: list[tuple[int, bool, Blocks]]) -> int:
    """Compile (worker process): one small call per configuration, same specialisations as the real shapes."""
    done = 0
    for m, gated, blocks in items:
        x = torch.randn(m, 1024, device="cuda", dtype=BF16)
        w = torch.randn(1024 if gated else 512, 1024, device="cuda", dtype=BF16)
        try:
            skinny_gemm(x, w, gated=gated, partials=blocks.split > 1, blocks=blocks)
            done += 1
        except Exception as e:  # (e.g. more shared memory than an SM has: skipped in the timings too)
            print(f"{blocks} rows={m} gated={gated}: {type(e).__name__}", flush=True)
    torch.cuda.synchronize()
    return done


def warm_in_parallel(rows: list[int], workers: int) -> None:
    keys = {}
    for m in rows:
        for shape in SHAPES.values():
            kind = shape[2]
            for b in candidates(m, kind, shape):
                key = (b.rows or padded_rows(m), kind == "gated", b.split > 1, b._replace(split=1, rows=0))
                keys.setdefault(key, (m, kind == "gated", b._replace(split=min(b.split, 2))))
    items = list(keys.values())
    try:
        with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
            done = sum(pool.map(_warm, [items[i::workers] for i in range(workers)]))
        print(f"compiled {done} kernel variants in {workers} processes", flush=True)
    except Exception as e:  # (then each variant compiles on its first call here: slower, same figures)
        print(f"parallel compile failed ({e!r}); compiling as needed", flush=True)


def within_bound(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, kind: str) -> bool:
    ref = F.linear(x, w)
    if kind == "gated":
        ref = silu_mul_triton(ref)
        return bool(((out.float() - ref.float()).abs() <= ref.float().abs() * 2**-6 + 2**-8).all())
    y = out.sum(1) if out.dim() == 3 else out.float()
    bound = ref.float().abs() * 2**-7 + 2 * x.shape[1] * 2**-24 * F.linear(x.float().abs(), w.float().abs())
    return bool(((y - ref.float()).abs() <= bound).all())


def bench_shape(name: str, rows: list[int]) -> list[dict]:
    k, n, kind = SHAPES[name]
    calls = max(8, min(256, POOL_BYTES // (n * k * 2)))
    pool = (torch.randn(calls, n, k, device="cuda") * k**-0.5).to(BF16)
    gated, partials, out = kind == "gated", kind == "partials", []
    gb = n * k * 2 / 1e9
    for m in rows:
        x = torch.randn(m, k, device="cuda").to(BF16)

        def cublas(i):
            y = F.linear(x, pool[i])
            return silu_mul_triton(y) if gated else y

        us = graph_call_us(cublas, calls)
        out.append(dict(shape=name, m=m, kernel="cublas", us=us, gb_s=gb / us * 1e6))
        for b in candidates(m, kind, SHAPES[name]):
            try:
                ok = within_bound(skinny_gemm(x, pool[0], gated=gated, partials=partials, blocks=b), x, pool[0], kind)
            except Exception:  # (does not fit the SM: see _warm)
                continue
            us = graph_call_us(lambda i, b=b: skinny_gemm(x, pool[i], gated=gated, partials=partials, blocks=b), calls)
            out.append(dict(shape=name, m=m, kernel="skinny", blocks=list(b), ok=ok, us=us, gb_s=gb / us * 1e6))
        best = min((r for r in out if r["m"] == m and r["kernel"] == "skinny" and r["ok"]), key=lambda r: r["us"])
        base = next(r for r in out if r["m"] == m and r["kernel"] == "cublas")
        print(
            f"{name:12s} M={m:2d}: cuBLAS {base['us']:6.2f} µs ({base['gb_s']:5.0f} GB/s), skinny {best['us']:6.2f} µs "
            f"({best['gb_s']:5.0f} GB/s) {tuple(best['blocks'])}",
            flush=True,
        )
    return out


def tune(results: list[dict], rows: list[int]) -> dict:
    """Per table key the configuration with the least total µs over the key's rows, or None where
    cuBLAS's total is less; max_rows: the most rows measured (beyond them cuBLAS, unmeasured)."""
    tuned = []
    for name, (k, n, kind) in SHAPES.items():
        gated = kind == "gated"
        if name in HEADS:
            continue
        for bucket in sorted({padded_rows(m) for m in rows}):
            ms = [m for m in rows if padded_rows(m) == bucket]
            total: dict = {}  # blocks (None: cuBLAS) -> [µs summed, rows measured]
            for r in results:
                if r["shape"] == name and r["m"] in ms and (r["kernel"] == "cublas" or r["ok"]):
                    t = total.setdefault(tuple(r["blocks"]) if r["kernel"] == "skinny" else None, [0.0, 0])
                    t[0], t[1] = t[0] + r["us"], t[1] + 1
            complete = {key: us for key, (us, count) in total.items() if count == len(ms)}
            choice = min(complete, key=complete.get)
            tuned.append([[bucket, n // 2 if gated else n, k, gated, kind == "partials"], choice and list(choice)])
    variants = {
        (key[0] if not blocks[5] else blocks[5], key[3], key[4] and blocks[2] > 1, *blocks[:2], *blocks[3:5])
        for key, blocks in tuned
        if blocks
    }
    return dict(max_rows=max(rows), tuned=tuned, compiled_variants=len(variants))


def report(results: list[dict], tuned: dict, out: Path) -> None:
    lines = ["# Skinny GEMM vs cuBLAS (µs per call inside a CUDA graph, weights from HBM)", ""]
    lines.append(f"max_rows (kernel <= cuBLAS on the decoder shapes' total): {tuned['max_rows']}")
    rows = []
    for name in SHAPES:
        for m in sorted({r["m"] for r in results if r["shape"] == name}):
            rs = [r for r in results if r["shape"] == name and r["m"] == m]
            base = next(r for r in rs if r["kernel"] == "cublas")
            best = min((r for r in rs if r["kernel"] == "skinny" and r["ok"]), key=lambda r: r["us"])
            bad = sum(not r["ok"] for r in rs if r["kernel"] == "skinny")
            rows.append([name, m, base["us"], round(base["gb_s"]), best["us"], round(best["gb_s"]), best["blocks"]])
            rows[-1].append(bad)
    headers = ["shape", "M", "cuBLAS µs", "GB/s", "skinny µs", "GB/s", "best blocks", "configs off bound"]
    lines += ["", markdown_table(headers, rows), "", "tuned (padded rows, N, K, gated, may split) -> blocks:", ""]
    lines += [f"    {tuple(key)}: {blocks and Blocks(*blocks)}," for key, blocks in tuned["tuned"]]
    lines += ["", f"compiled variants the table implies (cold start): {tuned['compiled_variants']}"]
    (out / "skinny_gemm.md").write_text("\n".join(lines) + "\n")


def entries(table: dict) -> dict:
    """``tune``'s table -> the tuned-config entries (``skinny_gemm.pick_blocks``'s keys; "cublas" or a tile)."""
    return {sg._key(*key): Blocks(*blocks)._asdict() if blocks else sg.CUBLAS for key, blocks in table["tuned"]}


def apply(path: Path, script: str, args: list[str]) -> None:
    table = json.loads(path.read_text())
    sg.MAX_ROWS = table["max_rows"] or sg.MAX_ROWS
    measured = {key: sg._entry(value) for key, value in entries(table).items()}
    tuned_tiles = sg.tuned_blocks
    sg.tuned_blocks = lambda kernel, device=None: (
        tuned_tiles(kernel, device) | (measured if kernel == "skinny_gemm" else {})
    )
    print(f"skinny_gemm: MAX_ROWS={sg.MAX_ROWS}, {len(table['tuned'])} tuned configurations", flush=True)
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


def main() -> None:
    if sys.argv[1:2] == ["--apply"]:  # --apply TUNED_JSON SCRIPT ARGS... (the script's arguments untouched)
        return apply(Path(sys.argv[2]), sys.argv[3], sys.argv[4:])
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path)
    p.add_argument("--rows", default="1,2,8,16,32")
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--heads", action="store_true", help="also the LM-head shapes (not on the fast path)")
    p.add_argument("--shapes", choices=sorted(SHAPE_SETS), default="qwen3-omni", help="whose decode shapes")
    p.add_argument("--names", help="comma-separated subset of the set's shapes (default: all)")
    p.add_argument("--tune", action="store_true", help="write the tiles into omniwalk/kernels/configs/ for this GPU")
    args = p.parse_args()
    global SHAPES
    SHAPES = SHAPE_SETS[args.shapes]
    if args.names:
        SHAPES = {name: SHAPES[name] for name in args.names.split(",")}
    names = [name for name in SHAPES if args.heads or name not in HEADS]
    table = run(args.out, names, [int(m) for m in args.rows.split(",")], args.workers)
    if args.tune:
        command = " ".join(["benchmarks/kernels/skinny_gemm.py", *sys.argv[1:]])
        path = tuned_configs.save("skinny_gemm", tuned_configs.device_of(), entries(table), command)
        print(f"wrote {path}", flush=True)


@torch.inference_mode()
def run(out: Path, names: list[str], rows: list[int], workers: int) -> dict:
    if workers:
        warm_in_parallel(rows, workers)
    results = []
    for name in names:
        results += bench_shape(name, rows)
        torch.cuda.empty_cache()
    out.mkdir(parents=True, exist_ok=True)
    (out / "skinny_gemm.json").write_text(json.dumps(results, indent=1))
    tuned = tune(results, rows)
    (out / "tuned.json").write_text(json.dumps(tuned, indent=1))
    report(results, tuned, out)
    return tuned


if __name__ == "__main__":
    main()
