"""Instructions per weight of the FP8 (and bf16) decode kernels, compiled for sm_90a on the CPU.

    PYTHONPATH=. python benchmarks/fp8_sass.py [--out DIR]

No GPU needed: each kernel is called as the fast path calls it (CPU tensors of the decoders' shapes),
its launch is recorded instead of run, and the same signature (dtypes, the launcher's 16-divisibility
and ==1 specialisations, constexprs, warps, stages) is compiled with ``triton.compile`` for
``GPUTarget("cuda", 90, 32)``; the cubin is disassembled with the cuobjdump Triton ships. Reported per
kernel: SASS instructions in the main loop (the largest backward branch's body) per weight element a
thread handles per iteration, the loop's shared-memory loads and barriers (a layout conversion's round
trip), its most frequent opcodes, registers and spilled bytes. The
kernels are compiled with PDL and the PTX widening on, as on the H200.

Writes fp8_sass.md (and .json) under --out.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, when not installed
from omniwalk.kernels import fused_moe  # noqa: E402
from omniwalk.kernels import skinny_gemm as sg  # noqa: E402
from omniwalk.kernels.tuned import Device  # noqa: E402
from omniwalk.layers.fp8 import DEFAULT_BLOCK, ExpertScales, quantize  # noqa: E402

TYPES = {torch.bfloat16: "bf16", torch.float8_e4m3fn: "fp8e4nv", torch.float32: "fp32", torch.int32: "i32"}
TYPES |= {torch.int64: "i64", torch.float16: "fp16", torch.int16: "i16"}
# name: (K, N, gated): the skinny GEMM's M = 1 shapes (N: I for a gated product)
SHAPES = {
    "thinker qkv": (2048, 5120, False, False),
    "thinker o": (4096, 2048, False, True),
    "talker qkv": (1024, 2560, False, False),
    "talker o": (2048, 1024, False, True),
    "cp qkv": (1024, 4096, False, False),
    "cp gate_up": (1024, 3072, True, False),
    "cp down": (3072, 1024, False, True),
}


class Recorder:
    """Stands in for a Triton kernel: ``kernel[grid](*args, **kwargs)`` records the call."""

    def __init__(self, kernel):
        self.kernel, self.calls = kernel, []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((grid, args, kwargs))


def compile_call(kernel, args, kwargs, asm: bool = True):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend

    kwargs = dict(kwargs)
    warps, stages = kwargs.pop("num_warps", 4), kwargs.pop("num_stages", 3)
    kwargs.pop("launch_pdl", None)
    kwargs["USE_PDL"] = True
    if kwargs.get("SCALED") and "WIDEN_ASM" in kwargs:
        kwargs["WIDEN_ASM"] = asm
    params = dict(zip(kernel.arg_names, args, strict=False))
    skip = set(getattr(kernel, "do_not_specialize", ()) or ())
    names = set(kernel.arg_names)
    skip = {kernel.arg_names[i] if isinstance(i, int) else i for i in skip} & names
    signature, constants, attrs = {}, {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in kwargs:
            signature[name], constants[name] = "constexpr", kwargs[name]
            continue
        value = params[name]
        if isinstance(value, torch.Tensor):
            signature[name] = "*" + TYPES[value.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            if value == 1 and name not in skip:
                signature[name], constants[name] = "constexpr", 1
                continue
            signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
            if value % 16 == 0 and name not in skip:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "fp32"
    target = GPUTarget("cuda", 90, 32)
    options = make_backend(target).parse_options({"num_warps": warps, "num_stages": stages})
    src = ASTSource(fn=kernel, signature=signature, constexprs=constants, attrs=attrs)
    return triton.compile(src, target=target, options=options.__dict__)


def cuobjdump(compiled, flag: str) -> str:
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        return subprocess.run([str(tool), flag, f.name], capture_output=True, text=True, check=True).stdout


def sass(compiled) -> list[tuple[int, str]]:
    text = cuobjdump(compiled, "-sass")
    out = []
    for line in text.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            out.append((int(m.group(1), 16), re.sub(r"^@!?U?P[0-9T]\s+", "", m.group(2))))
    return out


def main_loop(code: list[tuple[int, str]]) -> list[str]:
    """The body of the largest loop: from a backward branch's target to the branch."""
    best: list[str] = []
    for address, ins in code:
        target = re.match(r"BRA\s+(?:`\(\.L_x_\d+\)\s+)?0x([0-9a-f]+)", ins)
        if target and int(target.group(1), 16) < address:
            body = [i for a, i in code if int(target.group(1), 16) <= a <= address]
            best = body if len(body) > len(best) else best
    return best


def report(name: str, compiled, weights_per_iteration: int, threads: int) -> dict:
    """(A kernel whose K loop is unrolled, one step for the whole row, counts all its instructions.)"""
    code = sass(compiled)
    body = main_loop(code) or [i for _, i in code]
    per_thread = weights_per_iteration / threads
    ops = collections.Counter(i.split()[0] for i in body)
    usage = dict(re.findall(r"(REG|STACK):(\d+)", cuobjdump(compiled, "-res-usage")))
    return {
        "kernel": name,
        "loop instructions": len(body) if main_loop(code) else f"{len(body)} (no loop)",
        "weights per thread per iteration": per_thread,
        "per weight": round(len(body) / per_thread, 2),
        "registers": int(usage["REG"]),
        "stack bytes (spills)": int(usage["STACK"]),
        "shared loads / barriers": f"{sum(n for op, n in ops.items() if op.startswith('LDS'))} / "
        f"{sum(n for op, n in ops.items() if op.startswith('BAR'))}",
        "top opcodes": ", ".join(f"{op} {n}" for op, n in ops.most_common(7)),
    }


def skinny_rows(asm: bool) -> list[dict]:
    rows = []
    for name, (k, n, gated, partials) in SHAPES.items():
        for fp8 in (False, True):
            w = torch.randn(2 * n if gated else n, k) * k**-0.5
            scale = None
            if fp8:
                w, scale = quantize(w, DEFAULT_BLOCK)
            else:
                w = w.to(torch.bfloat16)
            rec = Recorder(sg.skinny_gemm_kernel)
            blocks = sg.pick_blocks(1, n, k, gated, partials and not gated, fp8, Device("NVIDIA H200", (9, 0)))
            blocks = blocks or sg.default_blocks(1, n, k, False, fp8, gated)
            original = sg.skinny_gemm_kernel
            sg.skinny_gemm_kernel = rec
            try:
                sg.skinny_gemm(
                    torch.randn(1, k).to(torch.bfloat16),
                    w,
                    gated=gated,
                    partials=partials and blocks.split > 1,
                    blocks=blocks,
                    scale=scale,
                    scale_block=DEFAULT_BLOCK if fp8 else None,
                )
            finally:
                sg.skinny_gemm_kernel = original
            grid, args, kwargs = rec.calls[0]
            compiled = compile_call(rec.kernel, args, kwargs, asm)
            per_iteration = kwargs["BLOCK_N"] * kwargs["BLOCK_K"] * (2 if gated else 1)
            row = report(
                f"skinny {name} {'fp8' if fp8 else 'bf16'} {tuple(blocks)}", compiled, per_iteration, 32 * blocks.warps
            )
            rows.append(row)
            print(row, flush=True)
    return rows


def expert_rows(asm: bool) -> list[dict]:
    rows = []
    for name, hidden, inter in (("thinker", 2048, 768), ("talker", 1024, 384)):
        for fp8 in (False, True):
            gate_up = torch.randn(4, 2 * inter, hidden) * hidden**-0.5
            down = torch.randn(4, hidden, inter) * inter**-0.5
            scales = None
            if fp8:
                (gate_up, s1), (down, s2) = quantize(gate_up), quantize(down)
                scales = ExpertScales(s1.view(4, 2, -1, s1.shape[-1]), s2, DEFAULT_BLOCK)
            else:
                gate_up, down = gate_up.to(torch.bfloat16), down.to(torch.bfloat16)
            recs = (Recorder(fused_moe.expert_gate_up_kernel), Recorder(fused_moe.expert_down_kernel))
            original = (fused_moe.expert_gate_up_kernel, fused_moe.expert_down_kernel)
            fused_moe.expert_gate_up_kernel, fused_moe.expert_down_kernel = recs
            try:
                x = torch.randn(1, hidden).to(torch.bfloat16)
                ids = torch.zeros(1, 2, dtype=torch.int32)
                act = fused_moe.expert_gate_up(x, gate_up, ids, scales=scales)
                fused_moe.expert_down(act, down, torch.ones(1, 2), ids, scales=scales)
            finally:
                fused_moe.expert_gate_up_kernel, fused_moe.expert_down_kernel = original
            for rec, kind in zip(recs, ("gate_up", "down"), strict=True):
                grid, args, kwargs = rec.calls[0]
                compiled = compile_call(rec.kernel, args, kwargs, asm)
                if kind == "gate_up":
                    per_iteration = 2 * kwargs["BLOCK_I"] * kwargs["BLOCK_H"]
                else:
                    per_iteration = kwargs["BLOCK_N"] * kwargs["BLOCK_I"]
                row = report(
                    f"expert {kind} {name} {'fp8' if fp8 else 'bf16'}",
                    compiled,
                    per_iteration,
                    32 * kwargs.get("num_warps", 4),
                )
                rows.append(row)
                print(row, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--parts", default="skinny,experts")
    parser.add_argument("--no-asm", action="store_true", help="Triton's own e4m3 cast (the interpreter's)")
    args = parser.parse_args()
    rows = []
    if "skinny" in args.parts:
        rows += skinny_rows(not args.no_asm)
    if "experts" in args.parts:
        rows += expert_rows(not args.no_asm)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "fp8_sass.json").write_text(json.dumps(rows, indent=1))
        keys = list(rows[0])
        lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
        (args.out / "fp8_sass.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
