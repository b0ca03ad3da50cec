"""Run the package's Triton kernels on the CPU through Triton's interpreter (fp32/fp16 tensors).

Importing this module on a machine without CUDA sets TRITON_INTERPRET before anything imports
Triton (its standard library is built in interpreter mode only then; the package imports Triton
lazily, inside its kernel builders). ``interpreted`` is a fixture body that rebuilds the cached
kernels around a test. NOTE: Triton 3.6's interpreter turns a scalar into a 1-element array,
which numpy >= 2.4 refuses to convert with int() (``range`` over a loaded bound, e.g. the paged
decode loop): patched here.
"""

from __future__ import annotations

import os

import torch

from omniwalk.layers import fused_moe, moe_routing, norm, paged_decode, qk_norm_rope, silu_mul

ON_CPU = not torch.cuda.is_available()
if ON_CPU:
    os.environ["TRITON_INTERPRET"] = "1"
BUILDERS = (
    norm._kernel,
    qk_norm_rope._kernel,
    silu_mul._kernel,
    fused_moe._kernels,
    moe_routing._kernel,
    paged_decode._kernel,
)


def interpreted(monkeypatch):
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor

    def patch(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", patch)
    for build in BUILDERS:
        build.cache_clear()
    yield
    for build in BUILDERS:
        build.cache_clear()
