"""The kernel tests' shared code: the package's Triton kernels run on the CPU through Triton's interpreter
(fp32/fp16 tensors), and the references the kernels are held to (FP8 math emulated, sampling draws).

Importing this module on a machine without CUDA sets TRITON_INTERPRET (``conftest.py`` sets it too,
before any test module imports a kernel module: ``@triton.jit`` picks the interpreter as the module
is imported, and Triton's standard library is built in interpreter mode only when it is set before
Triton is imported). ``interpreted`` is a fixture body that patches the interpreter around a test
(``conftest.py``'s ``interpreter`` fixture runs it); ``CPU_ONLY`` marks a test that runs the kernels
through the interpreter (skipped where CUDA is: the ``gpu`` tests run the compiled kernels there), and
``TOL`` is the fp32 tolerance the CPU tests hold the kernels to against their references.
NOTE: Triton 3.6's interpreter turns a scalar into a 1-element array, which numpy >= 2.4 refuses to
convert with int() (``range`` over a loaded bound, e.g. the paged decode loop): patched here.
bfloat16 needs two more patches: ``tl.dot`` multiplied bf16 operands as their uint16 storage (now
widened to fp32 first: exact, the accumulation stays fp32 as on the GPU), and fp32 -> bf16 casts
truncated (now rounded to nearest even, as the GPU rounds). e4m3: ``tl.dot`` took the operands'
bytes as numbers (now widened exactly), and fp32 -> e4m3 casts that round up to the next power of
two lost that exponent step (7.79 -> 4; now rounded by torch, to nearest even as the GPU's
``cvt.rn.satfinite`` rounds: the values the kernels cast are clamped to e4m3's range first).

References for the FP8 grouped GEMM's tests (``test_fp8_kernels.py``, CPU and GPU):
its math emulated in fp32, and how near the weight-only reference it must stay.

Random draws for the fused sampling kernels' tests: ``BatchParams`` mixing every operation,
and a comparison with ``sampling.draw_reference`` that names the rows where the ids may differ."""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from omniwalk.layers.fp8 import dequantize, quantize
from omniwalk.sampling import BatchParams, SamplerState, SamplingParams, draw_reference, gumbel_noise, process_tensors

ON_CPU = not torch.cuda.is_available()
if ON_CPU:  # (before a kernel module is imported: ``@triton.jit`` picks the interpreter when it runs)
    os.environ["TRITON_INTERPRET"] = "1"

CPU_ONLY = pytest.mark.skipif(not ON_CPU, reason="interpreter tests run on the CPU machine")
TOL = dict(rtol=1e-5, atol=1e-5)


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


def rounded(a: torch.Tensor, group: int) -> torch.Tensor:
    """a [R, C] rounded as the grouped path rounds activations: e4m3 per row and group, back in fp32."""
    return dequantize(*quantize(a, (1, group)), (1, group), torch.float32)


def w8a8_experts(x, gate_up, down, weights, ids, group: int, act_group: int) -> torch.Tensor:
    """The grouped path's math in fp32, an expert at a time: x and silu(gate) * up rounded to e4m3 per row
    and ``group`` / ``act_group`` columns (``quantize(., (1, group))``), times the dequantised weights
    gate_up [E, 2I, H] and down [E, H, I] -> [N, k, H] weighted partials. gate, up, silu(gate) and their
    product are rounded to x's dtype before the e4m3 rounding, as the kernel rounds them (without it the
    emulation was 1.6-2.2% of the output's max off the kernel on the GPU: a bf16 rounding
    moves some activations to the next e4m3 value)."""
    xq, inter = rounded(x.float(), group), down.shape[2]
    out = torch.zeros(*ids.shape, x.shape[1], device=x.device)

    def round_(a):
        return a.to(x.dtype).float()

    for e in ids.unique().tolist():
        tokens, slots = (ids == e).nonzero(as_tuple=True)
        gate, up = (xq[tokens] @ gate_up[e].T).split(inter, 1)
        act = rounded(round_(round_(F.silu(round_(gate))) * round_(up)), act_group)
        out[tokens, slots] = weights[tokens, slots, None].float() * (act @ down[e].T)
    return out


def assert_activation_rounding(ours: torch.Tensor, ref: torch.Tensor) -> None:
    """Within e4m3's rounding of the activations (x, silu(gate) * up: <= 2^-4 of a value each, ~2.6% RMS; the
    difference's norm measured 3.6-4.2% of the output's on the CPU tests) of the reference, which
    multiplies them as they are: 10% of the output's norm (a wrong scale or row is off by its own size)."""
    err = ((ours.float() - ref.float()).norm() / ref.float().norm()).item()
    assert err < 0.1, err


TOP_KS = (1, 5, 50, 64, 65, 0)  # 64 / 65: either side of the kernel's partial sort; 0 = off
TOP_PS = (1.0, 0.95, 0.8, 0.5, 0.1)


def random_logits(num_rows: int, vocab: int, gen: torch.Generator, dtype=torch.float32, device="cpu") -> torch.Tensor:
    """Half the rows Gaussian, half coarse integers (many exact ties); some ids at -inf."""
    x = torch.randn(num_rows, vocab, generator=gen) * 3
    coarse = torch.randint(-4, 5, (num_rows, vocab), generator=gen).float()
    x = torch.where(torch.arange(num_rows)[:, None] % 2 == 1, coarse, x)
    x[torch.rand(num_rows, vocab, generator=gen) < 0.02] = -float("inf")  # (masked control ids)
    return x.to(dtype).to(device)


def random_states(num_rows: int, vocab: int, gen: torch.Generator) -> list[SamplerState]:
    """Requests with random parameters: greedy rows, penalties, min_tokens bans, top-k/top-p."""

    def pick(options):
        return options[int(torch.randint(len(options), (), generator=gen))]

    states = []
    for _ in range(num_rows):
        params = SamplingParams(
            temperature=pick((0.0, 0.5, 0.9, 1.0, 1.3)),
            top_k=min(pick(TOP_KS), vocab),
            top_p=pick(TOP_PS),
            repetition_penalty=pick((1.0, 1.0, 0.8, 1.05, 1.3)),
            min_tokens=pick((0, 0, 4)),
            max_tokens=8,
            seed=int(torch.randint(-(2**62), 2**62, (), generator=gen)),
        )
        prompt = torch.randint(vocab, (int(torch.randint(0, vocab // 4 + 2, (), generator=gen)),), generator=gen)
        state = SamplerState(params, (int(torch.randint(vocab, (), generator=gen)), 0), prompt.tolist())
        state.num_generated = int(torch.randint(0, 6, (), generator=gen))
        states.append(state)
    return states


def random_bitmask(num_rows: int, vocab: int, gen: torch.Generator, device="cpu") -> torch.Tensor:
    """Grammar bitmasks (``BatchParams.allowed``): odd rows allow every id, even rows about a third
    of them (at least one, and the bits past the vocabulary set, as a grammar engine may leave them)."""
    bits = torch.rand(num_rows, -(-vocab // 32) * 32, generator=gen) < 0.3
    bits[:, int(torch.randint(vocab, (), generator=gen))] = True
    bits[1::2] = True
    bits[:, vocab:] = True
    weights = 2 ** torch.arange(32, dtype=torch.int64)
    words = (bits.view(num_rows, -1, 32).long() * weights).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32).to(device)


def unexplained_rows(ids: torch.Tensor, logits: torch.Tensor, p: BatchParams, step_offset: int, noise_tol: float):
    """Rows where ``ids`` differ from the reference for no stated reason, and the number that
    differ where a difference is allowed: a top-p cut within 1e-5 of ``top_p`` (the kernel sums
    the softmax in its own order), or, with ``noise_tol`` > 0 (the CPU interpreter, whose numpy
    log differs from torch's in the last bit), two perturbed scores closer than that."""
    ref = draw_reference(logits, p, step_offset)
    near = _top_p_margin(logits, p) < 1e-5
    if noise_tol > 0 and p.sampled is not None:
        scores = process_tensors(logits, p) + gumbel_noise(p.seeds, p.steps + step_offset, logits.shape[1])
        top2 = scores.topk(2, dim=-1).values
        near |= p.sampled & ((top2[:, 0] - top2[:, 1]) <= noise_tol * top2[:, 0].abs().clamp(min=1))
    differ = ids.cpu() != ref.cpu()
    return (differ & ~near.cpu()).nonzero().flatten().tolist(), int((differ & near.cpu()).sum())


def _top_p_margin(logits: torch.Tensor, p: BatchParams) -> torch.Tensor:
    """Per row: the distance of the reference's mass-of-better-tokens to ``top_p`` (inf: no cut)."""
    margin = torch.full((logits.shape[0],), float("inf"), device=logits.device)
    if p.top_k is None:
        return margin
    scores = process_tensors(logits, replace(p, top_k=None, top_p=None))
    sorted_scores, _ = torch.sort(scores, dim=-1, descending=True, stable=True)
    ranks = torch.arange(scores.shape[1], device=scores.device)[None, :]
    probs = torch.softmax(sorted_scores.masked_fill(ranks >= p.top_k[:, None], -float("inf")), dim=-1)
    before = probs.cumsum(-1) - probs
    gap = (before - p.top_p[:, None]).abs().masked_fill(ranks >= p.top_k[:, None], float("inf"))
    return torch.where(p.top_p < 1.0, gap[:, 1:].min(-1).values, margin)
