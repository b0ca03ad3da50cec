"""The skinny GEMV compiled for the H200 (sm_90a) on any machine with Triton: the tiles ``pick_blocks`` picks for
decode at B = 1 (``TUNED``'s, else ``default_blocks``') keep every weight of a step in registers. A gated 32 x 512
tile (256 weights a thread) spilled 2.7 KB of stack a thread and made Qwen2.5-Omni-7B's dense gate/up GEMV, hence
its B = 1 decode step, many times slower than its weight-read floor on the H200. Register use and stack bytes come
from the cubin's resource usage (the ``cuobjdump`` Triton ships), as ``benchmarks/fp8_sass.py`` reads them. FP8
GEMVs too, at the tiles they use and at 128 weights a thread (the FP8 lanes sum 16 products each step: a lane per
weight spilled there, and in the code predictor's gate/up at its picked tile). The FP8 grouped expert GEMMs at their
tables' tiles too (``grouped_fp8``: gate_up's two fp32 accumulators spilled 488 bytes a thread at 64 x 128 in 4
warps)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# (K, N, gated, partials): a dense 7B decoder's projections at M = 1 (N is I for a gated product)
SHAPES = {"gate_up": (3584, 18944, True, False), "down": (18944, 3584, False, True), "qkv": (3584, 4608, False, False)}
# FP8 (Qwen3-Omni's): name -> (K, N, gated, partials, tile or None for the one picked)
FP8_SHAPES = {
    "thinker qkv": (2048, 5120, False, False, None),
    "thinker qkv, 128 a thread": (2048, 5120, False, False, (16, 1024, 1, 4, 1)),
    "thinker o, 128 a thread": (4096, 2048, False, False, (16, 1024, 1, 4, 1)),
    "cp gate_up": (1024, 3072, True, False, None),
    "cp down": (3072, 1024, False, True, None),
}

COMPILE = """
import re, sys
import torch
import fp8_sass as fs
from omniwalk.kernels import skinny_gemm as sg
from omniwalk.kernels.tuned import Device

from omniwalk.layers.fp8 import DEFAULT_BLOCK, quantize

k, n, gated, partials = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4] == "1")
fp8, tile = sys.argv[5] == "1", eval(sys.argv[6])
w = torch.randn(2 * n if gated else n, k)
w, scale = quantize(w, DEFAULT_BLOCK) if fp8 else (w.to(torch.bfloat16), None)
H200 = Device("NVIDIA H200", (9, 0))  # (the tiles tuned for it)
blocks = sg.Blocks(*tile) if tile else sg.pick_blocks(1, n, k, gated, partials and not gated, fp8, H200)
rec = fs.Recorder(sg.skinny_gemm_kernel)
original, sg.skinny_gemm_kernel = sg.skinny_gemm_kernel, rec
try:
    sg.skinny_gemm(torch.zeros(1, k, dtype=torch.bfloat16), w, gated=gated, partials=partials and blocks.split > 1,
                   blocks=blocks, scale=scale, scale_block=DEFAULT_BLOCK if fp8 else None)
finally:
    sg.skinny_gemm_kernel = original
grid, args, kwargs = rec.calls[0]
usage = dict(re.findall(r"(REG|STACK):(\\d+)", fs.cuobjdump(fs.compile_call(rec.kernel, args, kwargs), "-res-usage")))
print(usage["REG"], usage["STACK"])
"""


def _usage(k: int, n: int, gated: bool, partials: bool, fp8: bool = False, tile=None) -> tuple[int, int]:
    """(registers, stack bytes) a thread of the GEMV at M = 1 compiled for sm_90a."""
    pytest.importorskip("triton")
    env = {key: v for key, v in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "benchmarks"), env.get("PYTHONPATH", "")])
    args = [str(k), str(n), str(int(gated)), str(int(partials)), str(int(fp8)), repr(tile)]
    done = subprocess.run(
        [sys.executable, "-c", COMPILE, *args], env=env, capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    registers, stack = map(int, done.stdout.split()[-2:])
    return registers, stack


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_picked_gemv_tiles_do_not_spill_at_batch_one(name):
    registers, stack = _usage(*SHAPES[name])
    assert stack == 0, f"{name}: {registers} registers and {stack} bytes of stack a thread"


@pytest.mark.parametrize("name", sorted(FP8_SHAPES))
def test_fp8_gemv_tiles_do_not_spill(name):
    k, n, gated, partials, tile = FP8_SHAPES[name]
    registers, stack = _usage(k, n, gated, partials, True, tile)
    assert stack == 0, f"{name}: {registers} registers and {stack} bytes of stack a thread"


GROUPED = """
import re, sys
import torch
import fp8_sass as fs
from omniwalk.kernels import grouped_fp8 as G
from omniwalk.layers.fp8 import FP8

gated, size, tile = sys.argv[1] == "1", int(sys.argv[2]), eval(sys.argv[3])
(G.GATE_UP_BLOCKS if gated else G.DOWN_BLOCKS)[size] = tile or (G.GATE_UP_BLOCKS if gated else G.DOWN_BLOCKS)[size]
experts, hidden, inter = 128, 2048, 768  # (the thinker's experts)
pairs = 8192 if size == 64 else 256
k, n = (hidden, 2 * inter) if gated else (inter, hidden)
rec = fs.Recorder(G.grouped_kernel)
G.grouped_kernel = rec
rows = G.Quantized(torch.zeros(pairs, k, dtype=FP8), torch.ones(pairs, k // 128), 128)
scale = torch.ones(experts, 2, inter // 128, k // 128) if gated else torch.ones(experts, n // 128, k // 128)
G.grouped_gemm(rows, torch.zeros(pairs, dtype=torch.long) if gated else None, torch.zeros(experts, n, k, dtype=FP8),
               scale, (128, 128), torch.zeros(experts, dtype=torch.int32), torch.bfloat16)
grid, args, kwargs = rec.calls[0]
usage = dict(re.findall(r"(REG|STACK):(\\d+)", fs.cuobjdump(fs.compile_call(rec.kernel, args, kwargs), "-res-usage")))
print(usage["REG"], usage["STACK"])
"""


def _grouped_usage(gated: bool, size: int, tile=None) -> tuple[int, int]:
    """(registers, stack bytes) a thread of the FP8 grouped GEMM at its table's tile (or ``tile``), sm_90a."""
    pytest.importorskip("triton")
    env = {key: v for key, v in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "benchmarks"), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", GROUPED, str(int(gated)), str(size), repr(tile)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    registers, stack = map(int, done.stdout.split()[-2:])
    return registers, stack


@pytest.mark.parametrize("gated", [True, False], ids=["gate_up", "down"])
@pytest.mark.parametrize("size", [16, 64])
def test_fp8_grouped_tiles_do_not_spill(gated, size):
    registers, stack = _grouped_usage(gated, size)
    assert stack == 0, f"{registers} registers and {stack} bytes of stack a thread"


def test_fp8_grouped_gate_up_in_four_warps_spills():
    """Why gate_up's 64-row tile takes 8 warps (and that the usage read above sees a spill)."""
    assert _grouped_usage(True, 64, (64, 128, 4, 4))[1] > 0
