"""FP8 weights (``--quantization fp8``) against bf16: kernel times and the thinker's accuracy.

    PYTHONPATH=. python benchmarks/kernels/fp8.py SKELETON_DIR --out DIR [--parts kernels,accuracy]
    PYTHONPATH=. python benchmarks/kernels/fp8.py /tmp/tiny --device cpu --out DIR --parts accuracy  # (a CPU check)

Parts:

    kernels   µs per call in CUDA graphs (weights from HBM: C copies, >= 512 MB; its parts alone:
              projections, moe, prefill): the decoders' projections at M = 1 and 32 as bf16 (the fast
              path's pick: skinny GEMM or cuBLAS) and FP8 (the weight widened in registers; at M = 1
              also through tl.dot, rows padded to 16);
              a thinker MoE layer (router + routing + experts) at 1, 8, 32 and 1,024 tokens, bf16 vs FP8
              (GEMVs; at 32 and 1,024 tokens the grouped GEMMs, and at 32 GEMVs of both for comparison); a prefill-sized
              dense product (M = 2048): bf16 cuBLAS vs FP8 dequantised + cuBLAS vs ``torch._scaled_mm``
              (per-row scales: what cuBLAS FP8 takes here; not our block-wise format, timed only).
    accuracy  the thinker with the same random weights in bf16 and FP8 (quantised at load): a 64-token
              greedy run of bf16 per prompt; FP8 fed the same tokens (teacher forcing): cosine of the
              logits per step, share of steps with the same argmax; FP8's own greedy run: share of ids
              equal to bf16's; then the FP8 weights dequantised in place (the bf16 model of the same values,
              run by bf16's kernels) fed the same tokens: its cosine to bf16 (the format's cost) and to FP8's
              logits (the FP8 kernels' own). Decode steps run the decode kernels (one token per forward).

    tune      FP8 launch configurations (``fp8_tune.py``): the skinny GEMM per projection at M = 1 and 32, the expert
              GEMVs (gate_up, down) at 1 and 8 tokens, the grouped GEMMs' tiles (``grouped_fp8``'s
              gate_up tiles, then down's with the best gate_up in place; a thinker MoE layer timed
              whole) at 16 rows (32 tokens) and 64 rows (1,024 tokens);
              writes tuned.json (the fastest of each) and, with ``--save-configs``, this GPU's tuned
              configurations (``omniwalk/kernels/configs/``: skinny_gemm_fp8, fused_moe, grouped_fp8).

Timings of whole steps are micro.py's (``--option quantization=fp8``). Writes fp8.json and fp8.md.
``--apply tuned.json SCRIPT ARGS...`` runs SCRIPT (e.g. micro.py) in this process with those tables
in place, to measure them before they are saved into the package.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import runpy
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path[:0] = [str(Path(__file__).resolve().parents[i]) for i in (2, 1)]  # the repository root, benchmarks/
from fp8_tune import BF16, POOL_BYTES, SHAPES, _linears, apply_tuned, fp8_product, tune_fp8, tuned_entries  # noqa: E402
from harness import graph_call_us, int_list, machine, markdown_table, prompt_text, write_report  # noqa: E402

from omniwalk.kernels import tuned as tuned_configs  # noqa: E402
from omniwalk.kernels.registry import DECODE_ATTENTION  # noqa: E402
from omniwalk.kernels.skinny_gemm import Blocks  # noqa: E402
from omniwalk.layers import moe  # noqa: E402
from omniwalk.layers.decoder import RowsKVCache  # noqa: E402
from omniwalk.layers.fp8 import DEFAULT_BLOCK, Fp8Linear, dequantize, quantize  # noqa: E402
from omniwalk.layers.linear import SkinnyLinear  # noqa: E402
from omniwalk.layers.moe import SparseMoE  # noqa: E402
from omniwalk.models.common.checkpoint.loader import Backends, randomize  # noqa: E402
from omniwalk.models.qwen3_omni.checkpoint.loader import load_components  # noqa: E402
from omniwalk.tokenizer import Tokenizer  # noqa: E402

# FP8 at M = 1: GEMV tiles of 64 weights a thread (the fp32 tile the GEMV carries; more spill), for tuning
FP8_GEMV = [Blocks(8, 1024, 1, 4, 1), Blocks(16, 1024, 1, 8, 1), Blocks(4, 2048, 1, 4, 1), Blocks(16, 512, 1, 4, 1)]


@torch.inference_mode()
def bench_projections() -> list[dict]:
    rows_out = []
    for name, (k, rows, kind) in SHAPES.items():
        n = sum(rows)
        copies = max(4, min(128, POOL_BYTES // (n * k * 2)))
        bf16, fp8 = _linears(k, rows, kind, copies)
        gb_bf16, gb_fp8 = n * k * 2 / 1e9, n * k / 1e9
        for m in (1, 32):
            x = torch.randn(m, k, device="cuda").to(BF16)
            row = dict(shape=name, m=m, bf16_us=graph_call_us(lambda i: bf16[i](x), copies))
            row["fp8_us"] = graph_call_us(lambda i: fp8[i](x), copies)

            dot = Blocks(64, 128, 1, 4, 6, rows=16 if m == 1 else 0)  # (the table's dot configuration)
            if m == 1:
                row["fp8_dot_us"] = graph_call_us(lambda i: fp8_product(x, fp8[i], dot), copies)
                row["fp8_gemv_us"] = {
                    str(tuple(b)): graph_call_us(lambda i, b=b: fp8_product(x, fp8[i], b), copies) for b in FP8_GEMV
                }
            row |= dict(bf16_gb_s=gb_bf16 / row["bf16_us"] * 1e6, fp8_gb_s=gb_fp8 / row["fp8_us"] * 1e6)
            rows_out.append(row)
            print(
                f"{name:12s} M={m:2d}: bf16 {row['bf16_us']:6.2f} µs ({row['bf16_gb_s']:5.0f} GB/s)  fp8 "
                f"{row['fp8_us']:6.2f} µs ({row['fp8_gb_s']:5.0f} GB/s)",
                flush=True,
            )
    return rows_out


@torch.inference_mode()
def bench_moe() -> list[dict]:
    """A thinker MoE layer (2048 hidden, 128 experts, top 8, 768 wide), copies past L2."""
    copies, out = 6, []
    layers, fp8_layers = [], []
    for i in range(copies):
        with torch.device("cuda"):
            layer = SparseMoE(2048, 128, 8, 768, True, backend="fused").to(BF16)
        randomize(layer, i)
        layers.append(layer)
        fp8_layers.append(copy.deepcopy(layer))
        fp8_layers[-1].experts.quantize(DEFAULT_BLOCK)
    for tokens in (1, 8, 32, 1024):  # 1,024: a prefill chunk (the grouped GEMMs)
        x = torch.randn(tokens, 2048, device="cuda").to(BF16)
        row = dict(tokens=tokens, pairs=tokens * 8, bf16_us=graph_call_us(lambda i: layers[i](x), copies))
        row["fp8_us"] = graph_call_us(lambda i: fp8_layers[i](x), copies)
        if tokens == 32:  # past the GEMVs (grouped GEMMs above); the GEMVs of both for comparison
            saved = moe.MAX_GEMV_PAIRS
            moe.MAX_GEMV_PAIRS = 256
            try:
                row["bf16_gemv_us"] = graph_call_us(lambda i: layers[i](x), copies)
                row["fp8_gemv_us"] = graph_call_us(lambda i: fp8_layers[i](x), copies)
            finally:
                moe.MAX_GEMV_PAIRS = saved
        out.append(row)
        print(f"thinker MoE layer, {tokens:2d} tokens: {row}", flush=True)
    return out


@torch.inference_mode()
def bench_prefill() -> list[dict]:
    out = []
    for name, (k, rows, _) in SHAPES.items():
        n, m = sum(rows), 2048
        w = (torch.randn(n, k, device="cuda") * k**-0.5).to(BF16)
        q, scale = quantize(w, DEFAULT_BLOCK)
        x = torch.randn(m, k, device="cuda").to(BF16)
        row = dict(shape=name, m=m, bf16_us=graph_call_us(lambda i: F.linear(x, w), 4))
        row["fp8_dequant_us"] = graph_call_us(lambda i: F.linear(x, dequantize(q, scale, DEFAULT_BLOCK, BF16)), 4)
        try:  # per-row weight scales and per-token x scales (not the block-wise format)
            w_rows = w.float().abs().amax(1, keepdim=True) / 448
            wq, xq = (w / w_rows).to(torch.float8_e4m3fn), (x / 1.0).to(torch.float8_e4m3fn)
            x_rows = torch.ones(m, 1, device="cuda")
            row["scaled_mm_rowwise_us"] = graph_call_us(
                lambda i: torch._scaled_mm(xq, wq.t(), scale_a=x_rows, scale_b=w_rows.t(), out_dtype=BF16), 4
            )
        except Exception as e:  # noqa: BLE001 - recorded, not fatal
            row["scaled_mm_rowwise_us"] = f"{type(e).__name__}: {str(e)[:80]}"
        out.append(row)
        print(f"prefill {name} M={m}: {row}", flush=True)
    return out


@torch.inference_mode()
def greedy_logits(thinker, ids: torch.Tensor, steps: int, forced: torch.Tensor | None, backend: str):
    """Prompt ``ids`` then ``steps`` one-token decode forwards -> (logits [steps, vocab] fp32, the ids
    fed back: ``forced`` (teacher forcing) or each step's argmax)."""
    cfg, p = thinker.cfg, thinker.lm_head.weight
    decode = DECODE_ATTENTION.load("triton") if backend == "fused" else None  # (as the code predictor's)
    cache = RowsKVCache(
        1,
        cfg.num_hidden_layers,
        cfg.num_key_value_heads,
        cfg.head_dim,
        p.dtype,
        p.device,
        ids.numel() + steps + 1,
        decode,
    )
    logits = thinker(ids, torch.arange(ids.numel(), device=p.device), cache).logits[-1:]
    out, fed = [], []
    for t in range(steps):
        out.append(logits[0].float())
        token = forced[t : t + 1] if forced is not None else logits[0].argmax().view(1)
        fed.append(token)
        logits = thinker(token, torch.tensor([ids.numel() + t], device=p.device), cache).logits
    return torch.stack(out), torch.cat(fed)


def build_thinker(skeleton: str, device: str, dtype, quantization: str):
    fast = torch.device(device).type == "cuda"
    backends = Backends(moe="fused", decoder_kernels="fused") if fast else Backends()
    start = time.perf_counter()
    part = load_components(
        skeleton, ("thinker",), dtype=dtype, device=device, backends=backends, random_seed=0, quantization=quantization
    )["thinker"]
    gib = sum(p.numel() * p.element_size() for p in part.parameters()) / 2**30
    print(f"thinker {quantization}: built in {time.perf_counter() - start:.1f} s, {gib:.2f} GiB of weights", flush=True)
    return part, gib, backends.decoder_kernels


def bench_accuracy(args) -> dict:
    dtype = BF16 if torch.device(args.device).type == "cuda" else torch.float32
    tokenizer = Tokenizer.from_dir(args.model)
    prompts = [torch.tensor(tokenizer.encode(prompt_text(i, 24)), device=args.device) for i in range(args.prompts)]
    thinker, gib_bf16, backend = build_thinker(args.model, args.device, dtype, "none")
    runs = [greedy_logits(thinker, ids, args.steps, None, backend) for ids in prompts]
    del thinker
    gc.collect()
    if torch.device(args.device).type == "cuda":
        torch.cuda.empty_cache()
    thinker, gib_fp8, backend = build_thinker(args.model, args.device, dtype, "fp8")
    rows = []
    for i, (ids, (ref_logits, ref_ids)) in enumerate(zip(prompts, runs, strict=True)):
        forced_logits, _ = greedy_logits(thinker, ids, args.steps, ref_ids, backend)
        _, own_ids = greedy_logits(thinker, ids, args.steps, None, backend)
        cos = F.cosine_similarity(forced_logits, ref_logits, dim=-1)
        same = (own_ids == ref_ids).float()
        first_diff = int((own_ids != ref_ids).nonzero()[0]) if bool((own_ids != ref_ids).any()) else args.steps
        rows.append(
            dict(
                prompt=i,
                prompt_tokens=ids.numel(),
                cosine_mean=cos.mean().item(),
                cosine_min=cos.min().item(),
                argmax_agree=(forced_logits.argmax(-1) == ref_logits.argmax(-1)).float().mean().item(),
                greedy_ids_equal=same.mean().item(),
                first_difference=first_diff,
                fp8_logits=forced_logits,
            )
        )
    # The same weight values in the dtype, run by its kernels: what the format costs, apart from FP8's kernels
    dequantize_in_place(thinker, dtype)
    for ids, (ref_logits, ref_ids), row in zip(prompts, runs, rows, strict=True):
        logits, _ = greedy_logits(thinker, ids, args.steps, ref_ids, backend)
        row["dequantised_cosine_mean"] = F.cosine_similarity(logits, ref_logits, dim=-1).mean().item()
        row["fp8_vs_dequantised_cosine_mean"] = F.cosine_similarity(row.pop("fp8_logits"), logits, dim=-1).mean().item()
        print(f"accuracy prompt {row['prompt']}: {row}", flush=True)
    return dict(steps=args.steps, weight_gib_bf16=gib_bf16, weight_gib_fp8=gib_fp8, prompts=rows)


@torch.no_grad()
def dequantize_in_place(model: torch.nn.Module, dtype) -> None:
    """Every FP8 weight of ``model`` (``Fp8Linear``s, fast-path ``SkinnyLinear``s, ``FusedExperts``) replaced by
    its dequantised values in ``dtype`` (``fp8.dequantize``'s: the bf16 model of the FP8 weights), one at a time."""
    for name, m in list(model.named_modules()):
        if isinstance(m, Fp8Linear):
            parent, _, attr = name.rpartition(".")
            linear = torch.nn.Linear(m.weight.shape[1], m.weight.shape[0], bias=False, device="meta")
            linear.weight = torch.nn.Parameter(m.dequantized(dtype), requires_grad=False)
            setattr(model.get_submodule(parent), attr, linear)
        elif isinstance(m, SkinnyLinear) and m.weight_scale_inv is not None:
            m.weight = torch.nn.Parameter(dequantize(m.weight, m.weight_scale_inv, m.block, dtype), requires_grad=False)
            m.weight_scale_inv, m.block = None, None
        elif isinstance(m, moe.FusedExperts) and m.block is not None:
            gate_up, down = m.dequantized(dtype)
            m.gate_up_proj = torch.nn.Parameter(gate_up, requires_grad=False)
            m.down_proj = torch.nn.Parameter(down, requires_grad=False)
            m.gate_up_proj_scale_inv = m.down_proj_scale_inv = m.block = None
    left = [name for name, p in model.named_parameters() if p.dtype == torch.float8_e4m3fn]
    if left:
        raise RuntimeError(f"FP8 weights left after dequantising: {left[:4]}")


def report(results: dict) -> str:
    lines = ["# FP8 vs bf16", "", f"{results['machine']['device']}, torch {results['machine']['torch']}"]
    if results.get("projections"):
        cols = ["shape", "m", "bf16_us", "fp8_us", "fp8_dot_us", "bf16_gb_s", "fp8_gb_s"]
        rows = [[r.get(c) for c in cols] for r in results["projections"]]
        lines += ["", "## Projections (µs per call, CUDA graphs)", "", markdown_table(cols, rows)]
    if results.get("moe"):
        cols = ["tokens", "pairs", "bf16_us", "fp8_us", "bf16_gemv_us", "fp8_gemv_us"]
        rows = [[r.get(c) for c in cols] for r in results["moe"]]
        lines += ["", "## Thinker MoE layer (µs per call)", "", markdown_table(cols, rows)]
    if results.get("prefill"):
        cols = ["shape", "m", "bf16_us", "fp8_dequant_us", "scaled_mm_rowwise_us"]
        rows = [[r.get(c) for c in cols] for r in results["prefill"]]
        lines += ["", "## Prefill-sized products (µs per call)", "", markdown_table(cols, rows)]
    if results.get("tune"):
        rows = [[f["shape"], f["m"], tuple(f["best"]), f["us"]] for f in results["tune"]["figures"] if "best" in f]
        lines += ["", "## FP8 launch configurations (fastest; all in fp8.json)", ""]
        lines.append(markdown_table(["shape", "m", "blocks", "us"], rows))
        lines += [f"MoE: {k} {v}" for k, v in results["tune"]["tuned"].items() if k != "skinny"]
    if results.get("accuracy"):
        acc = results["accuracy"]
        lines += [
            "",
            f"## Thinker accuracy ({acc['steps']} greedy steps; weights {acc['weight_gib_bf16']:.2f} GiB "
            f"bf16, {acc['weight_gib_fp8']:.2f} GiB FP8)",
            "",
        ]
        cols = list(acc["prompts"][0])
        lines.append(markdown_table(cols, [[r[c] for c in cols] for r in acc["prompts"]]))
    return "\n".join(lines)


def main() -> None:
    if sys.argv[1:2] == ["--apply"]:  # --apply tuned.json SCRIPT ARGS...
        apply_tuned(Path(sys.argv[2]))
        sys.argv = sys.argv[3:]
        sys.path.insert(0, str(Path(sys.argv[0]).resolve().parent))
        runpy.run_path(sys.argv[0], run_name="__main__")
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model", help="checkpoint or weightless skeleton directory")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--parts", default="accuracy,kernels")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--tune-rows", type=int_list, default=[1, 32], help="tune: the row counts M to tune for")
    p.add_argument("--save-configs", action="store_true", help="tune: write this GPU's configs into the package")
    args = p.parse_args()
    results = {"machine": machine(args.device), "args": {k: str(v) for k, v in vars(args).items()}}
    parts = args.parts.split(",")
    if "accuracy" in parts:
        print("-- accuracy", flush=True)
        results["accuracy"] = bench_accuracy(args)
        write_report(args.out, "fp8", results, report(results))
    if "tune" in parts:
        print("-- tune", flush=True)
        args.out.mkdir(parents=True, exist_ok=True)
        results["tune"] = tune_fp8(tuple(args.tune_rows))
        (args.out / "tuned.json").write_text(json.dumps(results["tune"], indent=1))
        if args.save_configs:
            command = " ".join(["benchmarks/kernels/fp8.py", *sys.argv[1:]])
            for kernel, values in tuned_entries(results["tune"]["tuned"]).items():
                print(f"wrote {tuned_configs.save(kernel, tuned_configs.device_of(), values, command)}", flush=True)
    for name, bench in (("projections", bench_projections), ("moe", bench_moe), ("prefill", bench_prefill)):
        if "kernels" in parts or name in parts:
            print(f"-- {name}", flush=True)
            results[name] = bench()
            write_report(args.out, "fp8", results, report(results))
            torch.cuda.empty_cache()
    print(report(results))


if __name__ == "__main__":
    main()
