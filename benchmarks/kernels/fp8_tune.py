"""FP8 launch configurations tuned on this GPU (``fp8.py --parts tune``; ``--apply`` puts a tuned.json in place),
and the decoders' projection shapes both its parts time.

The skinny GEMM per projection at M = 1 and 32 (GEMV tiles at 1, ``tl.dot`` tiles at 32, split along K where
the product takes partial sums), the expert GEMVs (gate_up, down) at 1 + 8 tokens, and the grouped GEMMs'
tiles (``grouped_fp8``: gate_up's, then down's with the best gate_up in place; a thinker MoE layer timed whole)
at 16 rows (32 tokens) and 64 rows (1,024 tokens). Compiles first in spawned worker processes.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch
from harness import graph_call_us

from omniwalk.kernels import fused_moe, grouped_fp8
from omniwalk.kernels import skinny_gemm as sg
from omniwalk.kernels import tuned as tuned_configs
from omniwalk.kernels.skinny_gemm import Blocks, skinny_gemm
from omniwalk.layers.fp8 import DEFAULT_BLOCK, Fp8Linear
from omniwalk.layers.linear import SkinnyLinear
from omniwalk.layers.moe import SparseMoE
from omniwalk.models.common.checkpoint.loader import randomize

BF16 = torch.bfloat16
POOL_BYTES = 512 << 20
# name: (K, parts' rows, kind), merged as the fast path merges them
SHAPES = {
    "thinker qkv": (2048, (4096, 512, 512), "plain"),
    "thinker o": (4096, (2048,), "partials"),
    "talker qkv": (1024, (2048, 256, 256), "plain"),
    "talker o": (2048, (1024,), "partials"),
    "cp gate_up": (1024, (3072, 3072), "gated"),
    "cp down": (3072, (1024,), "partials"),
}


def _linears(k: int, rows: tuple[int, ...], kind: str, copies: int) -> tuple[list[SkinnyLinear], list[SkinnyLinear]]:
    """``copies`` merged projections in bf16 and the same ones in FP8."""
    bf16, fp8 = [], []
    for _ in range(copies):
        parts = [torch.nn.Linear(k, n, bias=False, device="cuda", dtype=BF16) for n in rows]
        for p in parts:
            torch.nn.init.normal_(p.weight, 0.0, k**-0.5)
        merge = dict(gated=kind == "gated", partials=kind == "partials")
        bf16.append(SkinnyLinear.merge(*parts, **merge))
        fp8.append(SkinnyLinear.merge(*(Fp8Linear.from_linear(p) for p in parts), **merge))
    return bf16, fp8


def fp8_product(x: torch.Tensor, linear: SkinnyLinear, blocks: Blocks | None = None) -> torch.Tensor:
    """An FP8 merged projection's product of ``x`` through the skinny GEMM with launch configuration ``blocks``."""
    return skinny_gemm(
        x,
        linear.weight,
        gated=linear.gated,
        partials=linear.partials,
        blocks=blocks,
        scale=linear.weight_scale_inv,
        scale_block=linear.block,
    )


TUNE_GEMV = [Blocks(8, 1024, 1, 4, 1), Blocks(8, 2048, 1, 4, 1), Blocks(16, 1024, 1, 4, 1), Blocks(16, 2048, 1, 8, 1)]
TUNE_GEMV += [Blocks(4, 4096, 1, 4, 1), Blocks(8, 4096, 1, 8, 1), Blocks(4, 2048, 1, 4, 1)]
TUNE_DOT = [Blocks(64, 128, 1, 4, 6), Blocks(32, 128, 1, 4, 6), Blocks(128, 128, 1, 8, 4), Blocks(32, 128, 1, 4, 8)]
TUNE_DOT += [Blocks(16, 128, 1, 4, 6), Blocks(64, 128, 1, 4, 4), Blocks(64, 128, 1, 8, 6), Blocks(16, 128, 1, 4, 8)]
TUNE_DOT += [Blocks(32, 64, 1, 4, 8), Blocks(64, 64, 1, 4, 8), Blocks(32, 128, 1, 4, 4)]  # (the chained dot's)
TUNE_GATE_UP = [(2, 2048, 4), (4, 2048, 4), (4, 2048, 8), (8, 2048, 8), (2, 1024, 4), (4, 1024, 4)]
TUNE_DOWN = [(16, 256, 8), (16, 512, 8), (32, 256, 8), (8, 512, 4), (16, 1024, 8), (32, 512, 8)]
# the grouped GEMMs' tiles (grouped_fp8): (rows, columns, warps, stages); gate_up's columns are also the down
# GEMM's activation group
TUNE_GROUPED_GATE_UP = {
    16: [(16, 128, 4, 4), (16, 64, 4, 4), (16, 64, 4, 3), (16, 32, 4, 4), (16, 128, 4, 3), (16, 128, 8, 3)],
    64: [(64, 128, 8, 4), (64, 64, 4, 4), (64, 64, 4, 3), (128, 64, 8, 3), (128, 64, 8, 4), (64, 64, 8, 4)],
}
TUNE_GROUPED_DOWN = {
    16: [(16, 64, 4, 4), (16, 128, 4, 4), (16, 32, 4, 4), (16, 64, 4, 3), (16, 128, 8, 3), (16, 64, 4, 5)],
    64: [(64, 128, 4, 3), (64, 256, 8, 3), (64, 128, 8, 3), (128, 128, 8, 3), (64, 128, 4, 4), (128, 64, 4, 3)],
}


def _tune_candidates(m: int, kind: str) -> list[Blocks]:
    base = TUNE_GEMV if m == 1 else TUNE_DOT
    return [b._replace(split=s) for b in base for s in ((1, 2, 4) if kind == "partials" else (1,))]


def _warm_skinny(items) -> int:
    """Compile (a worker process): one call per (shape, M, configuration)."""
    done = 0
    for k, rows, kind, m, blocks in items:
        try:
            _, fp8 = _linears(k, rows, kind, 1)
            fp8_product(torch.randn(m, k, device="cuda").to(BF16), fp8[0], blocks)
            done += 1
        except Exception as e:  # noqa: BLE001 - (e.g. out of shared memory: skipped when timed too)
            print(f"{blocks} M={m}: {type(e).__name__}", flush=True)
    torch.cuda.synchronize()
    return done


@torch.inference_mode()
def tune_fp8(rows: tuple[int, ...] = (1, 32), workers: int = 12) -> dict:
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    items = [
        (k, parts, kind, m, b) for k, parts, kind in SHAPES.values() for m in rows for b in _tune_candidates(m, kind)
    ]
    try:
        with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
            print(
                f"compiled {sum(pool.map(_warm_skinny, [items[i::workers] for i in range(workers)]))} variants",
                flush=True,
            )
    except Exception as e:  # noqa: BLE001 - (then each compiles on first use)
        print(f"parallel compile failed: {e!r}", flush=True)
    tuned, figures = {"skinny": []}, []
    for name, (k, parts, kind) in SHAPES.items():
        n = sum(parts)
        copies = max(4, min(128, POOL_BYTES // (n * k)))
        _, fp8 = _linears(k, parts, kind, copies)
        for m in rows:
            x = torch.randn(m, k, device="cuda").to(BF16)
            times = {}
            for b in _tune_candidates(m, kind):
                try:
                    times[b] = graph_call_us(lambda i, b=b: fp8_product(x, fp8[i], b), copies)
                except Exception:  # noqa: BLE001, S112 - (does not fit the SM)
                    continue
            best = min(times, key=times.get)
            n_key = n // 2 if kind == "gated" else n
            tuned["skinny"].append([[sg.padded_rows(m), n_key, k, kind == "gated", kind == "partials"], list(best)])
            figures.append(
                dict(shape=name, m=m, best=list(best), us=times[best], all={str(tuple(b)): t for b, t in times.items()})
            )
            print(f"tune {name} M={m}: {tuple(best)} {times[best]:.2f} µs", flush=True)
    tuned |= _tune_moe(figures, rows)
    return dict(tuned=tuned, figures=figures)


def _tune_moe(figures: list, rows: tuple[int, ...]) -> dict:
    """The expert GEMVs at 1 + 8 tokens (when 1 is in ``rows``), the grouped GEMM's tiles at 32 and 1,024
    tokens (when 32 is)."""
    copies, layers = 6, []
    for i in range(copies):
        with torch.device("cuda"):
            layer = SparseMoE(2048, 128, 8, 768, True, backend="fused").to(BF16)
        randomize(layer, i)
        layer.experts.quantize(DEFAULT_BLOCK)
        layers.append(layer)
    out = {}
    for what, variants in (("gate_up", TUNE_GATE_UP), ("down", TUNE_DOWN)) if 1 in rows else ():
        total = _time_variants(
            variants,
            functools.partial(_set_moe_gemv, what),
            lambda: sum(graph_call_us(lambda i: layers[i](x), copies) for x in _moe_inputs((1, 8))),
            fused_moe._blocks(what, DEFAULT_BLOCK, "cuda"),
        )
        out[what] = list(min(total, key=total.get))
        figures.append(dict(shape=f"thinker MoE {what} (1 + 8 tokens)", all={str(b): t for b, t in total.items()}))
        print(f"tune MoE {what}: {out[what]} {total}", flush=True)
        _set_moe_gemv(what, tuple(out[what]))
    # the grouped GEMMs' tiles: 16 rows at 32 tokens (decode), 64 rows at a 1,024-token prefill chunk; gate_up's
    # with down's in place, then down's with the best gate_up
    for tile, tokens in ((16, 32), (64, 1024)) if 32 in rows else ():
        for what, variants in (("gate_up", TUNE_GROUPED_GATE_UP[tile]), ("down", TUNE_GROUPED_DOWN[tile])):
            total = _time_variants(
                variants,
                functools.partial(_set_grouped, what, tile),
                lambda tokens=tokens: graph_call_us(lambda i: layers[i](_moe_inputs((tokens,))[0]), copies),
                grouped_fp8.grouped_blocks(what, tile, "cuda"),
            )
            key = f"grouped_{what}{tile}"
            out[key] = list(min(total, key=total.get))
            _set_grouped(what, tile, tuple(out[key]))
            figures.append(
                dict(shape=f"thinker MoE grouped {what} ({tokens} tokens)", all={str(b): t for b, t in total.items()})
            )
            print(f"tune MoE grouped {what} {tile}-row tile: {out[key]} {total}", flush=True)
    return out


def _time_variants(variants: list, apply, run, saved) -> dict:
    """µs of ``run()`` with each variant put in place by ``apply(variant)``, ``apply(saved)`` after each
    (a variant that fails, e.g. does not fit the SM, is left out)."""
    total = {}
    for variant in variants:
        apply(variant)
        try:
            total[variant] = run()
        except Exception:  # noqa: BLE001, S112
            continue
        finally:
            apply(saved)
    return total


@functools.cache
def _moe_inputs(tokens: tuple[int, ...]) -> list[torch.Tensor]:
    return [
        torch.randn(t, 2048, device="cuda", generator=torch.Generator("cuda").manual_seed(t)).to(BF16) for t in tokens
    ]


MOE_FIELDS = {"gate_up": ("rows", "columns", "warps"), "down": ("columns", "units", "warps")}
GROUPED_FIELDS = ("rows", "columns", "warps", "stages")


def _configs(kernel: str) -> dict:
    """This GPU's tuned entries of ``kernel`` as this process reads them (changed in place to try a variant)."""
    return tuned_configs.configs(kernel, tuned_configs.device_of())


def _set_moe_gemv(what: str, blocks: tuple) -> None:
    _configs("fused_moe")[f"{what},fp8"] = dict(zip(MOE_FIELDS[what], blocks, strict=True))


def _set_grouped(what: str, tile: int, blocks: tuple) -> None:
    _configs("grouped_fp8")[f"{what},rows={tile}"] = dict(zip(GROUPED_FIELDS, blocks, strict=True))


def tuned_entries(tuned: dict) -> dict[str, dict]:
    """A tuned.json's tables -> the tuned-config entries, per kernel."""
    moe_gemvs = {
        f"{what},fp8": dict(zip(MOE_FIELDS[what], tuned[what], strict=True)) for what in MOE_FIELDS if what in tuned
    }
    grouped = {
        f"{what},rows={tile}": dict(zip(GROUPED_FIELDS, tuned[f"grouped_{what}{tile}"], strict=True))
        for what in MOE_FIELDS
        for tile in (16, 64)
        if f"grouped_{what}{tile}" in tuned
    }
    skinny = {sg._key(*key): Blocks(*blocks)._asdict() for key, blocks in tuned["skinny"]}
    return {"skinny_gemm_fp8": skinny, "fused_moe": moe_gemvs, "grouped_fp8": grouped}


def apply_tuned(path: Path) -> None:
    """Put a tuned.json's tables in place (this process)."""
    entries = tuned_entries(json.loads(path.read_text())["tuned"])
    for kernel, values in entries.items():
        _configs(kernel).update(values)
    sg.tuned_blocks.cache_clear()
    print(f"applied {path}: " + ", ".join(f"{len(v)} {k} entries" for k, v in entries.items()), flush=True)
