"""Run the package's Triton kernels on the CPU through Triton's interpreter (fp32/fp16 tensors).

Importing this module on a machine without CUDA sets TRITON_INTERPRET (``conftest.py`` sets it too,
before any test module imports a kernel module: ``@triton.jit`` picks the interpreter as the module
is imported, and Triton's standard library is built in interpreter mode only when it is set before
Triton is imported). ``interpreted`` is a fixture body that patches the interpreter around a test.
NOTE: Triton 3.6's interpreter turns a scalar into a 1-element array, which numpy >= 2.4 refuses to
convert with int() (``range`` over a loaded bound, e.g. the paged decode loop): patched here.
bfloat16 needs two more patches: ``tl.dot`` multiplied bf16 operands as their uint16 storage (now
widened to fp32 first: exact, the accumulation stays fp32 as on the GPU), and fp32 -> bf16 casts
truncated (now rounded to nearest even, as the GPU rounds). e4m3: ``tl.dot`` took the operands'
bytes as numbers (now widened exactly), and fp32 -> e4m3 casts that round up to the next power of
two lost that exponent step (7.79 -> 4; now rounded by torch, to nearest even as the GPU's
``cvt.rn.satfinite`` rounds: the values the kernels cast are clamped to e4m3's range first).
"""

from __future__ import annotations

import os

import numpy as np
import torch

ON_CPU = not torch.cuda.is_available()
if ON_CPU:  # (before a kernel module is imported: ``@triton.jit`` picks the interpreter when it runs)
    os.environ["TRITON_INTERPRET"] = "1"


def interpreted(monkeypatch):
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor

    def patch(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", patch)
    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", _dot_widening)
    cast = interpreter.InterpreterBuilder.cast_impl
    monkeypatch.setattr(interpreter.InterpreterBuilder, "cast_impl", lambda *a: _cast_rounding_bf16(cast, *a))
    to_fp = interpreter.InterpreterBuilder.create_fp_to_fp
    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_fp_to_fp", lambda *a: _cast_rounding_e4m3(to_fp, *a))
    yield


def _dot_widening(self, a, b, d, input_precision, max_num_imprecise_acc):
    import triton.language as tl
    from triton.runtime import interpreter

    def operand(x):
        if x.dtype.scalar == tl.float8e4nv:  # (stored as bytes)
            return torch.from_numpy(np.ascontiguousarray(x.data)).view(torch.float8_e4m3fn).float().numpy()
        if x.dtype.scalar != tl.bfloat16:
            return x.data
        return (x.data.astype(np.uint32) << 16).view(np.float32)  # bf16 = the top half of an fp32

    out = np.matmul(operand(a), operand(b), dtype=d.data.dtype) + d.data
    return interpreter.TensorHandle(out, d.dtype.scalar)


def _cast_rounding_bf16(cast, self, src, dst_type):
    import triton.language as tl
    from triton.runtime import interpreter

    if src.dtype.scalar != tl.float32 or dst_type.scalar != tl.bfloat16:
        return cast(self, src, dst_type)
    rounded = torch.from_numpy(np.ascontiguousarray(src.data)).to(torch.bfloat16).view(torch.int16)
    return interpreter.TensorHandle(rounded.numpy().view(np.uint16), tl.bfloat16)


def _cast_rounding_e4m3(to_fp, self, src, dst_type, rounding_mode):
    import triton.language as tl
    from triton.runtime import interpreter

    if src.dtype.scalar != tl.float32 or dst_type.scalar != tl.float8e4nv:
        return to_fp(self, src, dst_type, rounding_mode)
    rounded = torch.from_numpy(np.ascontiguousarray(src.data)).to(torch.float8_e4m3fn).view(torch.uint8)
    return interpreter.TensorHandle(rounded.numpy(), tl.float8e4nv)
