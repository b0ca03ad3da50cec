"""What the code predictor's frame kernels share (``persistent.py``, Triton; ``cuda_frame.py``, CUDA): the
weights stacked per kind, in the order both kernels take them; the frame's shape for a batch; the positions a
request's K/V holds in a frame."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from omniwalk.kernels.persistent_schedule import Shape


@dataclass(frozen=True)
class FrameWeights:
    """A code predictor's weights, one tensor per kind (built by ``of``: the modules' parameters become views
    of the stacks, so nothing is held twice)."""

    in_norm: torch.Tensor  # [layers, hidden]
    qkv: torch.Tensor  # [layers, (heads + 2 kv_heads) * head_dim, hidden]: q rows, then k, then v
    q_norm: torch.Tensor  # [layers, head_dim]
    k_norm: torch.Tensor  # [layers, head_dim]
    o: torch.Tensor  # [layers, hidden, heads * head_dim]
    post_norm: torch.Tensor  # [layers, hidden]
    gate_up: torch.Tensor  # [layers, 2 * intermediate, hidden]: gate rows, then up rows
    down: torch.Tensor  # [layers, hidden, intermediate]
    final_norm: torch.Tensor  # [hidden]
    heads: torch.Tensor  # [groups - 1, vocab, hidden]: the head of group g + 1 at g
    embeds: torch.Tensor  # [groups - 1, vocab, hidden]: group g + 1's codes' embeddings at g

    @classmethod
    def of(cls, cp) -> FrameWeights:
        """``cp``: a ``CodePredictor`` (after the decoder kernels, which merge q/k/v and gate/up)."""
        layers = list(cp.model.layers)
        return cls(
            in_norm=_stack([layer.input_layernorm.weight for layer in layers]),
            qkv=_stack([_qkv_weight(layer.self_attn) for layer in layers]),
            q_norm=_stack([layer.self_attn.q_norm.weight for layer in layers]),
            k_norm=_stack([layer.self_attn.k_norm.weight for layer in layers]),
            o=_stack([layer.self_attn.o_proj.weight for layer in layers]),
            post_norm=_stack([layer.post_attention_layernorm.weight for layer in layers]),
            gate_up=_stack([_gate_up_weight(layer.mlp) for layer in layers]),
            down=_stack([layer.mlp.down_proj.weight for layer in layers]),
            final_norm=cp.model.norm.weight.data,
            heads=_stack([head.weight for head in cp.lm_head]),
            embeds=_stack([table.weight for table in cp.model.codec_embedding]),
        )

    def tensors(self) -> list[torch.Tensor]:
        """The stacks in the kernels' argument order (this class's field order)."""
        return [getattr(self, f.name) for f in fields(self)]

    def frame_bytes(self) -> int:
        """The bytes of weights a frame reads: every layer's projections once a pass, and one head a pass."""
        passes = self.heads.shape[0]
        per_pass = sum(t.numel() * t.element_size() for t in (self.qkv, self.o, self.gate_up, self.down))
        return passes * per_pass + self.heads.numel() * self.heads.element_size()


def frame_shape(cp, batch: int) -> Shape:
    """The frame's sizes for ``batch`` requests (``cp``: a ``CodePredictor``)."""
    cfg = cp.cfg
    return Shape(
        batch,
        cfg.num_hidden_layers,
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
        cfg.intermediate_size,
        cfg.vocab_size,
        cp.num_code_groups,
    )


def capacity(groups: int) -> int:
    """Positions a frame's KV holds per request (a power of two: the attention's block)."""
    return 1 << (groups - 1).bit_length()


def _stack(params: list[torch.Tensor]) -> torch.Tensor:
    """One tensor [n, *shape] of ``params``; each parameter then becomes a view of its slice."""
    stacked = torch.stack([p.data for p in params])
    for i, p in enumerate(params):
        if isinstance(p, torch.nn.Parameter):
            p.data = stacked[i]
    return stacked


def _qkv_weight(attention) -> torch.Tensor:
    """The merged q/k/v weight (the fused kernels' ``qkv_proj``; else the three concatenated: the reference)."""
    if attention.qkv_proj is not None:
        return attention.qkv_proj.weight
    return torch.cat([attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight])


def _gate_up_weight(mlp) -> torch.Tensor:
    if mlp.gate_up_proj is not None:
        return mlp.gate_up_proj.weight
    return torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
