"""Floors for the micro-benchmarks: what a step must move and compute, and how fast this machine can.

    floor_ms = max(bytes / copy bandwidth, flops / matmul throughput)      both measured in the run

Bandwidth is a device-to-device copy (bytes read + bytes written per second); throughput a large
square matmul in the model's dtype. Bytes count weights once per step (a perfect kernel reads
each weight once, whatever the batch) plus the KV read; activations are ignored.

Decoder step of T tokens (one per request), per layer, in parameters:

    attention   H·d·(2·heads + 2·kv_heads) + 2·d (q/k norms) + 2·H (layer norms)
    MoE         E·H (router) + E_T·3·H·I + shared expert 3·H·I_s + H (its gate)
                E_T = distinct experts the T tokens route to; expected E·(1 - (1 - k/E)^T)
    dense MLP   3·H·I
    KV read     context tokens · 2 · kv_heads · d

Thinker decode step, B requests: decoder(B) + final norm + lm_head V·H + B embedding rows.
Talker step, B requests (one frame each): decoder(B) + codec head V·H + text projection
(H_thinker·I + I·H) + B embedding rows, then the code predictor: G-1 dense-decoder passes
(2B tokens, then B) with G-1 lm heads of V_cp·H; its per-frame KV (at most G+1 positions) is
ignored. FLOPs are 2 per weight use per token plus 4·d·heads per (query, key) pair.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omniwalk.layers.decoder import DecoderConfig
from omniwalk.models.qwen3_omni.checkpoint.config import TalkerConfig


@dataclass(frozen=True)
class Machine:
    copy_bytes_per_s: float
    matmul_flops_per_s: float


@dataclass(frozen=True)
class Work:
    """The least a step must do: bytes moved to or from memory, floating-point operations."""

    bytes: float
    flops: float

    def __add__(self, other: Work) -> Work:
        return Work(self.bytes + other.bytes, self.flops + other.flops)

    def floor_ms(self, m: Machine) -> float:
        return 1e3 * max(self.bytes / m.copy_bytes_per_s, self.flops / m.matmul_flops_per_s)


def measure_machine(device, dtype: torch.dtype, copy_bytes: int, matmul_size: int, timer) -> Machine:
    """``timer(fn) -> ms`` is the harness's median timer."""
    return Machine(copy_bandwidth(device, copy_bytes, timer), matmul_throughput(device, dtype, matmul_size, timer))


def copy_bandwidth(device, num_bytes: int, timer) -> float:
    """Bytes read + written per second by a device-to-device copy of a ``num_bytes`` buffer."""
    src = torch.ones(num_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * num_bytes / (timer(lambda: dst.copy_(src)) * 1e-3)


def matmul_throughput(device, dtype: torch.dtype, size: int, timer) -> float:
    """FLOP/s of a ``size``-square matmul in ``dtype``."""
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    return 2 * size**3 / (timer(lambda: a @ b) * 1e-3)


def expected_experts(num_experts: int, top_k: int, num_tokens: int) -> float:
    """Distinct experts hit by ``num_tokens`` tokens routed uniformly at random (top-k each)."""
    return num_experts * (1 - (1 - top_k / num_experts) ** num_tokens)


def _attention_params(c: DecoderConfig) -> int:
    return c.hidden_size * c.head_dim * 2 * (c.num_attention_heads + c.num_key_value_heads) + 2 * c.head_dim


def decoder_work(c: DecoderConfig, tokens: int, context: int, dtype_bytes: int, experts: float | None = None) -> Work:
    """One pass of ``tokens`` new tokens over all layers; ``context`` = keys read, summed over
    the tokens' requests; ``experts`` = distinct experts per layer (None: the uniform estimate)."""
    h = c.hidden_size
    attention = _attention_params(c) + 2 * h
    if c.is_moe:
        expert = 3 * h * c.moe_intermediate_size
        shared = 3 * h * c.shared_expert_intermediate_size + h if c.shared_expert_intermediate_size else 0
        fixed = attention + c.num_experts * h + shared
        touched = expected_experts(c.num_experts, c.num_experts_per_tok, tokens) if experts is None else experts
        params = fixed + touched * expert
        per_token = fixed + c.num_experts_per_tok * expert
    else:
        params = per_token = attention + 3 * h * c.intermediate_size
    layers = c.num_hidden_layers
    kv = context * 2 * c.num_key_value_heads * c.head_dim
    flops = 2 * tokens * per_token + 4 * context * c.num_attention_heads * c.head_dim
    return Work((layers * (params + kv) + h) * dtype_bytes, layers * flops)


def _matrix(rows: int, cols: int, tokens: int, dtype_bytes: int) -> Work:
    """A weight matrix read once and applied to ``tokens`` rows."""
    return Work(rows * cols * dtype_bytes, 2 * tokens * rows * cols)


def thinker_step(c: DecoderConfig, batch: int, context: int, dtype_bytes: int, experts=None) -> Work:
    embeddings = Work(batch * c.hidden_size * dtype_bytes, 0)
    head = _matrix(c.vocab_size, c.hidden_size, batch, dtype_bytes)
    return decoder_work(c, batch, context, dtype_bytes, experts) + head + embeddings


def talker_step(t: TalkerConfig, batch: int, context: int, dtype_bytes: int, experts=None) -> Work:
    lm, cp = t.text, t.code_predictor
    groups = t.num_code_groups - 1  # code-predictor groups, one pass and one head each
    work = decoder_work(lm, batch, context, dtype_bytes, experts)
    work += _matrix(lm.vocab_size, lm.hidden_size, batch, dtype_bytes)  # codec head
    work += _matrix(t.thinker_hidden_size, lm.intermediate_size, batch, dtype_bytes)  # text projection
    work += _matrix(lm.intermediate_size, lm.hidden_size, batch, dtype_bytes)
    work += Work(batch * (t.thinker_hidden_size + lm.hidden_size) * dtype_bytes, 0)  # embedding rows
    work += decoder_work(cp, 2 * batch, 0, dtype_bytes)
    for _ in range(groups - 1):
        work += decoder_work(cp, batch, 0, dtype_bytes)
    work += _matrix(groups * cp.vocab_size, cp.hidden_size, batch, dtype_bytes)  # one lm head per group
    return work
