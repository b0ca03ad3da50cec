"""Kernels compiled for the H200 (sm_90) on any machine with Triton.

The q/k norm + rope kernel: with the
compile options its launch uses, its PTX has no fused bf16 multiply-add. With LLVM's default
contraction it has one (``x * cos`` fused into the rotary's add), which skips a rounding the
reference makes: ~20% of q/k elements come out a bf16 step off on the H200. (The GPU
tests of ``test_fused_kernels.py`` assert the kernel bitwise equal to the reference.)

The persistent code-predictor kernel at full size: it compiles (ptxas included), and the ordering its
tiles rely on is in its PTX: tiles counted done with release semantics, the output projections' parts
counted with acquire-release (the tile counting a block's last one adds them all), the counts waited for
with acquire loads, activations read past L1 (``.cg``)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Compiles the kernel for sm_90 in a clean process (no TRITON_INTERPRET) and prints its PTX.
COMPILE = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from omniwalk.kernels import qk_norm_rope

fn = qk_norm_rope.qk_norm_rope_kernel
pointers = ["qkv_ptr", "qw_ptr", "kw_ptr", "cos_ptr", "sin_ptr", "q_ptr", "k_ptr", "v_ptr"]
consts = {"HEADS": 32, "KV_HEADS": 4, "D": 128, "HAS_SLOTS": True, "NORM": sys.argv[2] == "norm", "USE_PDL": True}
consts |= {"LORA": False, "BLOCK_R": 16}
pointers += ["t_ptr", "b_ptr"]
signature = {name: "*bf16" for name in pointers} | {"slots_ptr": "*i64", "lora_slots_ptr": "*i32", "eps": "fp32"}
signature |= {name: "constexpr" for name in consts}
signature |= {name: "i32" for name in fn.arg_names if name not in signature}
options = qk_norm_rope.COMPILE_OPTIONS if sys.argv[1] == "launch" else {}
kernel = triton.compile(ASTSource(fn, signature, consts), target=GPUTarget("cuda", 90, 32), options=options)
print(kernel.asm["ptx"])
"""


PERSISTENT = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from omniwalk.kernels import persistent
from omniwalk.kernels.persistent_schedule import Shape

fn = persistent.code_predictor_frame
shape = Shape(1, 5, 1024, 16, 8, 128, 3072, 2048, 16)
consts = dict(HIDDEN=1024, HEADS=16, KV_HEADS=8, HEAD_DIM=128, INTERMEDIATE=3072, VOCAB=2048, GROUPS=16, CAPACITY=16)
consts |= dict(COUNTERS=shape.counters, BLOCK_N=shape.block_n, BLOCK_K=shape.block_k, BLOCK_V=2048, BLOCK_H=1024)
consts |= dict(CANDIDATES=shape.candidates, PART=shape.part_width)
consts |= dict(PREFETCH=True, SPIN=True, TRACE=False)
types = {"table_ptr": "*i32", "counters_ptr": "*i32", "allowed_ptr": "*i32", "eps": "fp32", "scale": "fp32"}
types |= {name: "*i64" for name in ("codes_ptr", "top_k_ptr", "seeds_ptr", "steps_ptr", "trace_ptr", "candidates_ptr")}
types |= {name: "*fp32" for name in ("temperature_ptr", "penalty_ptr", "top_p_ptr")}
types |= {name: "*i1" for name in ("seen_ptr", "banned_ptr", "sampled_ptr")}
default = lambda n: "*bf16" if n.endswith("_ptr") else "i32"
signature = {n: "constexpr" if n in consts else types.get(n, default(n)) for n in fn.arg_names}
options = {"num_warps": persistent.WARPS}
kernel = triton.compile(ASTSource(fn, signature, consts), target=GPUTarget("cuda", 90, 32), options=options)
assert kernel.asm["cubin"]
print(kernel.asm["ptx"])
"""


def _ptx(options: str, norm: str = "norm", script: str = COMPILE) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", script, options, norm], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize("norm", ["norm", "rope only"])  # (Qwen3-style q/k norm; Qwen2-style: none)
def test_qk_norm_rope_ptx_keeps_the_rotary_products_rounding(norm):
    pytest.importorskip("triton")
    ptx = _ptx("launch", norm)
    # the rotary products rounded to bf16: converted from fp32 (after the norm), or, rope only, bf16 products
    # of bf16 values (exact in fp32, so one rounding either way: the reference's)
    assert ("cvt.rn.bf16.f32" if norm == "norm" else "mul.rn.bf16") in ptx
    assert "fma.rn.bf16" not in ptx
    assert "fma.rn.bf16" in _ptx("default", norm)  # what the options prevent


def test_the_persistent_kernel_compiles_with_its_ordering():
    pytest.importorskip("triton")
    ptx = _ptx("", script=PERSISTENT)
    assert "atom.global.gpu.release.add" in ptx  # a tile counted finished
    assert "atom.global.gpu.acq_rel.add" in ptx  # a column block's part counted (the last one reduces the block)
    assert "ld.global.gpu.acquire" in ptx  # the counts waited for
    assert "ld.global.cg" in ptx and "prefetch.global.L2" in ptx  # (a tile's weights asked into L2 before its wait)
