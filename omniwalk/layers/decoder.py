"""The causal decoder shared by the thinker LM, the talker LM and the code predictor.

One layer (pre-norm): ``h += o_proj(Attn(input_layernorm(h)))``, ``h += MLP(post_attention_layernorm(h))``.
Attention: GQA, causal, scale head_dim^-0.5, either per-head RMSNorm on q and k *before* rope with
bias-free projections, or biased q/k/v projections without the q/k norm (``DecoderConfig.qkv_bias`` /
``qk_norm``). Rope is MRoPE (interleaved or sectioned, ``rope.interleaved``) when
``DecoderConfig.rope.mrope_section`` is set, else 1-D.
MLP is a ``SparseMoE`` (optionally with a shared expert) or a dense ``GatedMLP``.

The residual stream is carried as ``(h, delta)``: a sub-block's output ``delta`` is added by the
next norm (``RMSNorm.add``: one kernel on the fast path, which also sums the fused MoE's per-pair
partials), so the decoder's final norm takes the last layer's MLP output. At one row that norm runs
inside the next skinny GEMV where it can (``SkinnyLinear.normed``: the code predictor's decode passes).

Fused decoder kernels (``decoder_kernels="fused"``, the registry ``DECODER_KERNELS``; applied by
``use_kernels`` once the weights are loaded): every RMSNorm's add + norm in one kernel; q/k/v merged
into one ``qkv_proj`` GEMM (biases added in its epilogue), then one kernel for the q/k RMSNorm (where the
attention has one) + rotary, writing the new keys/values straight into a decode step's KV store
(``KVCache.kv_slots``); gate/up merged likewise, silu·mul in the GEMM (``GatedMLP.merge_projections``).
The projections become ``SkinnyLinear``s: decode-sized inputs through one weight-streaming kernel,
whose o_proj/down_proj output may be split-K partial sums that the next ``RMSNorm.add`` sums.

Tensors are per request and unbatched: hidden [tokens, hidden]. Keys and values live in a
``KVCache`` object passed into ``forward``: the engine's paged ones, or a contiguous per-request
one in the component tests (``tests/helpers/single_request.py``). Module names match the checkpoint
(``layers.N.self_attn.q_proj`` ...), so ``weights.load_weights`` fills them directly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from omniwalk.kernels.registry import DECODER_KERNELS, PERSISTENT_DECODE
from omniwalk.layers.kv_attention import causal_attention
from omniwalk.layers.linear import LoraExpand, LoraRows, MergesProjections, SkinnyLinear
from omniwalk.layers.moe import GatedMLP, SparseMoE
from omniwalk.layers.norm import RMSNorm, residual_add
from omniwalk.layers.rotary import apply_rotary, mrope_cos_sin, rope_cos_sin, rotary_tables

KVOut = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # keys, values [slots, kv_heads, d], slots [n]


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding: ``mrope_section`` (T, H, W slot counts) is None for plain 1-D rope;
    ``interleaved``: the T/H/W slots interleaved, else in three sections (``layers/rotary.py``)."""

    theta: float
    mrope_section: tuple[int, ...] | None = None
    interleaved: bool = True


@dataclass(frozen=True)
class DecoderConfig:
    """A causal transformer decoder (a family's language models: the thinker, a talker ...).

    ``num_experts == 0`` means dense MLPs of ``intermediate_size``; otherwise every layer is a
    MoE of ``num_experts`` experts of ``moe_intermediate_size``, plus a sigmoid-gated shared
    expert when ``shared_expert_intermediate_size > 0``.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: RopeConfig
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True
    qkv_bias: bool = False  # q_proj, k_proj, v_proj carry biases
    qk_norm: bool = True  # per-head RMSNorm on q and k before rope

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0


class KVCache(Protocol):
    """Where keys/values live during a forward, and how new queries attend to them.

    Implementations: the engine's ``PagedBatch`` (many requests packed along the token axis, keys
    in pages), ``RowsKVCache`` below. During a forward every layer calls ``attend`` once with that
    forward's new q/k/v; the decoder calls ``advance`` after the last layer.
    """

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store k, v [n, kv_heads, d] and return causal attention of q [n, heads, d] -> [n, heads, d]."""
        ...

    def advance(self, num_new: int) -> None: ...

    def kv_slots(self, layer: int, num_new: int) -> KVOut | None:
        """(keys, values, slots) when a fused kernel may write this forward's ``num_new`` keys
        straight into the store (then ``attend_stored`` attends), else None (use ``attend``)."""
        ...

    def attend_stored(self, layer: int, q: torch.Tensor) -> torch.Tensor: ...


class RowsKVCache:
    """Keys/values of B independent sequences that always advance together (same length), e.g.
    the code predictor's fresh per-frame caches of a batch of requests. Packed inputs are
    row-major: [B * n] tokens = n new tokens of row 0, then row 1, ...

    Storage per layer is [B * capacity, kv_heads, d] (row r's position t at slot r * capacity + t):
    the paged layout with one page per row, so with a ``paged_decode`` implementation (an entry of the
    registry ``DECODE_ATTENTION``) a pass of one token per row stores through ``kv_slots`` and attends
    with it; without, every pass attends through ``attend``.
    """

    def __init__(
        self,
        rows: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype,
        device,
        capacity: int,
        paged_decode: Callable | None = None,
    ):
        self.rows, self.capacity, self.num_tokens = rows, capacity, 0
        shape = (rows * capacity, num_kv_heads, head_dim)
        self.keys = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.paged_decode = paged_decode
        if paged_decode is not None:  # per position t: each row's slot and key count, made once ([capacity, rows])
            steps = torch.arange(capacity, device=device)[:, None]
            self._slots = torch.arange(rows, device=device)[None, :] * capacity + steps
            self._lens = (steps + 1).to(torch.int32).expand(capacity, rows).contiguous()
            self._table = torch.arange(rows, dtype=torch.int32, device=device)[:, None]

    def _rows(self, store: torch.Tensor) -> torch.Tensor:
        return store.view(self.rows, self.capacity, *store.shape[1:])

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, n = self.rows, q.shape[0] // self.rows
        end = self.num_tokens + n
        keys, values = self._rows(self.keys[layer]), self._rows(self.values[layer])
        keys[:, self.num_tokens : end] = k.view(b, n, *k.shape[1:])
        values[:, self.num_tokens : end] = v.view(b, n, *v.shape[1:])
        qs = q.view(b, n, *q.shape[1:]).transpose(1, 2)
        out = causal_attention(qs, keys[:, :end].transpose(1, 2), values[:, :end].transpose(1, 2))
        return out.transpose(1, 2).reshape(q.shape)

    def kv_slots(self, layer: int, num_new: int) -> KVOut | None:
        if self.paged_decode is None or num_new != self.rows:
            return None
        return self.keys[layer], self.values[layer], self._slots[self.num_tokens]

    def attend_stored(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        lens = self._lens[self.num_tokens]
        return self.paged_decode(q, self.keys[layer], self.values[layer], self._table, lens, self.capacity)

    def advance(self, num_new: int) -> None:
        self.num_tokens += num_new // self.rows


def _adapted(projection: nn.Module, x: torch.Tensor, layer: int, module: str, lora: LoraRows | None) -> torch.Tensor:
    """``projection(x)`` with the rows' adapters of (layer, module) added (none: as it is)."""
    return projection(x) if lora is None else lora.project(projection, x, layer, module)


def _head_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def qk_norm_rope_reference(qkv, q_weight, k_weight, eps, cos, sin, heads, kv_heads, kv_out: KVOut | None = None):
    """The attention input from a merged q/k/v output as the PyTorch composition (the oracle of
    ``kernels/qk_norm_rope.py``, whose docstring gives the shapes) -> (q [n, heads, d], k, v [n, kv_heads, d];
    k, v are None when written to ``kv_out``)."""
    n, d = qkv.shape[0], cos.shape[-1]
    q, k, v = qkv.view(n, heads + 2 * kv_heads, d).split([heads, kv_heads, kv_heads], dim=1)
    if q_weight is not None:
        q, k = _head_norm(q, q_weight, eps), _head_norm(k, k_weight, eps)
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    if kv_out is None:
        return q, k, v
    keys, values, slots = kv_out
    keys.index_copy_(0, slots, k.to(keys.dtype))
    values.index_copy_(0, slots, v.to(values.dtype))
    return q, None, None


class Attention(MergesProjections):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        d = cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        bias = cfg.qkv_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.num_heads * d, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * d, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps) if cfg.qk_norm else nn.Identity()
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps) if cfg.qk_norm else nn.Identity()
        self.qkv_proj: SkinnyLinear | None = None  # the fused kernels' merged projection
        self.qk_norm_rope: Callable | None = None  # and their q/k norm + rope (+ KV store) kernel

    def merge_projections(self) -> None:
        from omniwalk.kernels.qk_norm_rope import qk_norm_rope_triton

        self.qk_norm_rope = qk_norm_rope_triton
        self.qkv_proj = SkinnyLinear.merge(self.q_proj, self.k_proj, self.v_proj)
        self.o_proj = SkinnyLinear.merge(self.o_proj, partials=True)  # (the layer's RMSNorm.add sums them)
        del self.q_proj, self.k_proj, self.v_proj

    def forward(self, x, cos, sin, cache: KVCache, layer: int, lora: LoraRows | None = None) -> torch.Tensor:
        """x [n, hidden] -> the attention's output [n, hidden]; ``lora``: the rows' adapters, added after
        each projection (on the merged q/k/v output, to its column slices)."""
        n = x.shape[0]
        if self.qkv_proj is not None:
            qkv, expand = self._qkv(x, layer, lora)
            return self._output(self._fused(qkv, cos, sin, cache, layer, expand), layer, lora)
        q, k, v = (_adapted(p, x, layer, name, lora) for p, name in self._projections())
        q = apply_rotary(self.q_norm(q.view(n, self.num_heads, self.head_dim)), cos, sin)
        k = apply_rotary(self.k_norm(k.view(n, self.num_kv_heads, self.head_dim)), cos, sin)
        out = cache.attend(layer, q, k, v.view(n, self.num_kv_heads, self.head_dim))  # [n, heads, d]
        return self._output(out.reshape(n, self.num_heads * self.head_dim), layer, lora)

    def _projections(self):
        return (self.q_proj, "q_proj"), (self.k_proj, "k_proj"), (self.v_proj, "v_proj")

    def _qkv(self, x, layer: int, lora: LoraRows | None) -> tuple[torch.Tensor, LoraExpand | None]:
        """The merged q/k/v projection of x [n, hidden] with the rows' adapters: merged in the pool too (the
        shrink folded into the projection where it can be, its expand then left to the rope kernel; else one
        add), else each part's added to its column slice."""
        if lora is not None and lora.holds(layer, "qkv_proj"):
            folded = lora.fold(self.qkv_proj, x, layer, "qkv_proj")
            return folded if folded is not None else (lora.add(self.qkv_proj(x), x, layer, "qkv_proj"), None)
        qkv = self.qkv_proj(x)
        if lora is not None:
            q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
            for module, start, width in (("q_proj", 0, q), ("k_proj", q, kv), ("v_proj", q + kv, kv)):
                lora.add(qkv[:, start : start + width], x, layer, module)
        return qkv, None

    def _output(self, attention: torch.Tensor, layer: int, lora: LoraRows | None) -> torch.Tensor:
        return _adapted(self.o_proj, attention, layer, "o_proj", lora)

    def after_norm(self, norm: RMSNorm, h, delta, cos, sin, cache: KVCache, layer: int, lora: LoraRows | None = None):
        """``norm.add(h, delta)`` into this attention -> (h + delta, the attention's output); on the fast
        path the norm runs inside the qkv GEMV where it can (``SkinnyLinear.normed``), unless adapters need
        the normed input itself."""
        if self.qkv_proj is None or lora is not None:
            h, x = norm.add(h, delta)
            return h, self(x, cos, sin, cache, layer, lora)
        h, qkv = self.qkv_proj.normed(norm, h, delta)
        return h, self.o_proj(self._fused(qkv, cos, sin, cache, layer))

    def _fused(self, qkv, cos, sin, cache: KVCache, layer: int, lora: LoraExpand | None = None) -> torch.Tensor:
        """The merged projection's output (biases added; ``lora``: the adapters' expand still to add) -> one
        (LoRA expand +) (norm +) rope (+ KV store) kernel, the attention [n, heads * d]."""
        n = qkv.shape[0]
        target = cache.kv_slots(layer, n)
        normed = isinstance(self.q_norm, RMSNorm)  # (else Qwen2-style: rope only)
        q_weight, k_weight = (self.q_norm.weight, self.k_norm.weight) if normed else (None, None)
        q, k, v = self.qk_norm_rope(
            qkv,
            q_weight,
            k_weight,
            self.q_norm.eps if normed else 0.0,
            cos,
            sin,
            self.num_heads,
            self.num_kv_heads,
            target,
            lora,
        )
        out = cache.attend(layer, q, k, v) if target is None else cache.attend_stored(layer, q)
        return out.reshape(n, self.num_heads * self.head_dim)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DecoderConfig, moe_backend: str = "reference"):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if cfg.is_moe:
            self.mlp = SparseMoE(
                cfg.hidden_size,
                cfg.num_experts,
                cfg.num_experts_per_tok,
                cfg.moe_intermediate_size,
                cfg.norm_topk_prob,
                cfg.shared_expert_intermediate_size,
                moe_backend,
            )
        else:
            self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, partial_output=True)

    def forward(
        self, h, delta, cos, sin, cache: KVCache, layer: int, lora: LoraRows | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Residual stream ``h`` + the previous layer's pending ``delta`` -> (h, this layer's MLP output).
        ``lora``: the rows' adapters, on the attention's projections and a dense MLP's (MoE experts: none,
        ``omniwalk/lora/adapters.py`` says why)."""
        h, attention = self.self_attn.after_norm(self.input_layernorm, h, delta, cos, sin, cache, layer, lora)
        if lora is None or isinstance(self.mlp, SparseMoE):
            return self.mlp.after_norm(self.post_attention_layernorm, h, attention)
        return self.mlp.after_norm(self.post_attention_layernorm, h, attention, lora, layer)


# Called after layer i (a key of the dict) with its output; returns the hidden state to continue with.
LayerHooks = dict[int, Callable[[torch.Tensor], torch.Tensor]]


def use_kernels(module: nn.Module, decoder_kernels: str, persistent_decode: str = "reference") -> None:
    """Once the weights are loaded, the implementations the config chose take their loaded form: every
    MoE layer prepares its experts for its implementation (the fused one folds its shared expert in),
    then the ``decoder_kernels`` entry of ``DECODER_KERNELS`` is applied to ``module``, then the
    ``persistent_decode`` entry of ``PERSISTENT_DECODE``."""
    for m in list(module.modules()):
        if isinstance(m, SparseMoE):
            m.impl.prepare(m)
    DECODER_KERNELS.load(decoder_kernels)(module)
    PERSISTENT_DECODE.load(persistent_decode)(module)


def keep_reference_kernels(module: nn.Module) -> None:
    """``decoder_kernels="reference"``: the PyTorch expressions as built (the oracle)."""


def use_fused_kernels(module: nn.Module) -> None:
    """``decoder_kernels="fused"`` (CUDA): every RMSNorm under ``module`` becomes its add + norm kernel and
    every ``MergesProjections`` module merges its projections: attention (then the fused q/k norm + rope +
    KV store), gated MLPs (the fused silu·mul), a model's heads (e.g. the code predictor's: skinny GEMVs),
    the encoders' and the DiT's projections (one cuBLAS GEMM each, and their kernels). Biased q/k/v
    projections without q/k norm (Qwen2-style) merge too: the GEMV adds the biases, the kernel ropes."""
    for m in list(module.modules()):
        if isinstance(m, RMSNorm):
            m.use_fused_kernel()
        elif isinstance(m, MergesProjections):
            m.merge_projections()


def keep_layered_steps(module: nn.Module) -> None:
    """``persistent_decode="reference"``: decode steps run layer by layer, kernel by kernel."""


def use_persistent_kernels(module: nn.Module, kind: str = "triton") -> None:
    """``persistent_decode="triton"`` (CUDA): every module under ``module`` with a persistent form of its
    small-batch step (``use_persistent_kernel``: the code predictor's frame) takes it."""
    for m in list(module.modules()):
        if hasattr(m, "use_persistent_kernel"):
            m.use_persistent_kernel(kind)


def use_persistent_cuda_kernels(module: nn.Module) -> None:
    """``persistent_decode="cuda"``: as ``use_persistent_kernels``, the CUDA kernels (bf16)."""
    use_persistent_kernels(module, "cuda")


class Decoder(nn.Module):
    """``layers`` + final ``norm``; embeddings and heads belong to the model that owns it."""

    def __init__(self, cfg: DecoderConfig, moe_backend: str = "reference"):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(DecoderLayer(cfg, moe_backend) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [3, n] (MRoPE; a [n] vector means all three rows equal) or [n] (1-D) -> cos, sin."""
        rope, d = self.cfg.rope, self.cfg.head_dim
        if rope.mrope_section is None:
            return rope_cos_sin(positions, d, rope.theta)
        if positions.dim() == 1:
            positions = positions.expand(3, -1)
        return mrope_cos_sin(positions, d, rope.theta, rope.mrope_section, rope.interleaved)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor | None,
        cache: KVCache,
        hooks: LayerHooks | None = None,
        tables: tuple[torch.Tensor, torch.Tensor] | None = None,
        head: nn.Module | None = None,
        lora: LoraRows | None = None,
    ) -> torch.Tensor:
        """x: [n, hidden] new tokens; positions: their rope positions -> final-normed hidden [n, hidden],
        or ``head`` of it (a ``SkinnyLinear`` head folds the final norm in: ``SkinnyLinear.normed``).
        ``tables``: their ``rotary_tables`` made beforehand (then ``positions`` is not used). ``lora``: the
        rows' LoRA adapters (None: the base model)."""
        cos, sin = tables if tables is not None else rotary_tables(*self.rotary(positions), x.dtype)
        h, delta = x, None
        for i, layer in enumerate(self.layers):
            h, delta = layer(h, delta, cos, sin, cache, i, lora)
            if hooks and i in hooks:
                h, delta = hooks[i](residual_add(h, delta)), None
        cache.advance(x.shape[0])
        if isinstance(head, SkinnyLinear):
            return head.normed(self.norm, h, delta)[1]
        out = self.norm.add(h, delta)[1]
        return out if head is None else head(out)
