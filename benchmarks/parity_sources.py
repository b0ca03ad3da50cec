"""Where the fused thinker's rounding still leaves HF's: the HF-parity GPU test
(``tests/test_thinker_gpu.py``, 3 full-size layers, a 90-token prefill) on the fused path with one
difference from HF's computation taken away at a time, in this process only (patched here, not in
the package):

    qkv split      the merged q/k/v projection as HF's three GEMMs (slices of the merged weight, so
                   cuBLAS sees HF's shapes)
    expert GEMMs   the grouped GEMM over expert-sorted pairs as HF's per-expert GEMMs (the same
                   per-pair outputs, in the pairs' order)

Each run prints the test's GPU-PARITY lines (all-logits cosine against HF bf16, same-route share,
distance to the fp32 truth). Usage (CUDA, transformers installed): python benchmarks/parity_sources.py
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import test_thinker_gpu  # noqa: E402

from omniwalk.layers import (
    decoder,  # noqa: E402
    moe,  # noqa: E402
)
from omniwalk.layers.qk_norm_rope import qk_norm_rope_triton  # noqa: E402
from omniwalk.layers.skinny_gemm import MAX_ROWS  # noqa: E402


def _split_qkv(self, x, cos, sin, cache, layer):
    if x.shape[0] <= MAX_ROWS:
        return original_fused(self, x, cos, sin, cache, layer)
    w, d = self.qkv_proj.weight, self.head_dim
    q, kv = self.num_heads * d, self.num_kv_heads * d
    qkv = torch.cat([F.linear(x, w[:q]), F.linear(x, w[q : q + kv]), F.linear(x, w[q + kv :])], dim=-1)
    args = (self.q_norm.weight, self.k_norm.weight, self.q_norm.eps, cos, sin, self.num_heads, self.num_kv_heads)
    return cache.attend(layer, *qk_norm_rope_triton(qkv, *args))


def _expert_gemms(x, gate_up, down, weights, ids):
    out = x.new_empty(*ids.shape, x.shape[1])
    for expert in torch.unique(ids).tolist():
        token, slot = torch.where(ids == expert)
        gate, up = F.linear(x[token], gate_up[expert]).chunk(2, dim=-1)
        out[token, slot] = F.linear(F.silu(gate) * up, down[expert]) * weights[token, slot, None]
    return out


original_fused = decoder.Attention._fused


@contextlib.contextmanager
def patched(qkv: bool, experts: bool):
    saved = decoder.Attention._fused, moe.grouped_experts
    try:
        if qkv:
            decoder.Attention._fused = _split_qkv
        if experts:
            moe.grouped_experts = _expert_gemms
        yield
    finally:
        decoder.Attention._fused, moe.grouped_experts = saved


def main() -> None:
    for name, qkv, experts in (
        ("qkv split", True, False),
        ("expert GEMMs", False, True),
        ("qkv split + expert GEMMs", True, True),
    ):
        print(f"--- fused kernels with {name}", flush=True)
        with patched(qkv, experts):
            try:
                test_thinker_gpu.test_full_size_thinker_layers_bf16_match_hf("fused")
            except AssertionError as e:
                print(f"(the test's assertion failed: {e})")
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
