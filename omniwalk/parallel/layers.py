"""Tensor parallelism as a transform of a loaded decoder (``shard_decoder``), in the Megatron split:

    attention   q/k/v column-split by heads (rank r: heads [r H/W, (r+1) H/W), KV heads likewise, so
                its query heads keep their GQA KV heads), o_proj row-split; output summed over ranks
    MoE         experts split along their intermediate size (every rank holds every expert: gate/up
                rows, down columns; the router is replicated, so ranks route alike); shared expert
                and dense MLPs the same way; output summed over ranks
    embedding   vocab-split: rank r holds ids [r V/W, ...), looks up its own, zeros the rest; summed
    lm_head     vocab-split, padded to W equal shards; the logits gathered (every rank gets all of them)

The residual stream and every norm stay replicated: a sub-block's summed output is handed to the
next ``RMSNorm.add`` as fp32 "partials" [N, 1, H] (``ReducedOutput``), which adds and rounds it as
it rounds the fused MoE's partials. The weights are cut after loading, before the fast path merges
projections (``loader.load_components(transform=...)``), so the merged q/k/v and gate/up of a rank
are its own shards. Modules are recognised by their parts (``q_proj``, ``o_proj``, ``experts``, ...)
so that a family's networks need no change.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from omniwalk.errors import ConfigError
from omniwalk.layers.moe import GatedMLP, SparseMoE
from omniwalk.parallel import ranks


def _share(total: int, rank: int, world: int, what: str) -> slice:
    if total % world:
        raise ConfigError(f"tensor_parallel {world} must divide {what} ({total})")
    n = total // world
    return slice(rank * n, (rank + 1) * n)


def _keep(linear: nn.Linear, rows: slice | None = None, cols: slice | None = None) -> None:
    w = linear.weight.data
    w = w[rows] if rows is not None else w
    w = w[:, cols] if cols is not None else w
    linear.weight = nn.Parameter(w.contiguous(), requires_grad=False)
    linear.out_features, linear.in_features = w.shape


class ReducedOutput(nn.Module):
    """A row-parallel sub-block: its output summed over the ranks -> fp32 partials [N, 1, H]."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, *args):
        return self._reduced(self.inner(*args))

    def after_norm(self, norm, h: torch.Tensor, delta: torch.Tensor | None, *args):
        """The decoder's ``norm.add(h, delta)`` into the sub-block (``after_norm``, as the inner one folds
        it) -> (h + delta, the output summed over the ranks)."""
        h, y = self.inner.after_norm(norm, h, delta, *args)
        return h, self._reduced(y)

    @staticmethod
    def _reduced(y: torch.Tensor) -> torch.Tensor:
        y = y.float().sum(-2, keepdim=True) if y.dim() == 3 else y.float()[:, None]  # (fused partials summed first)
        return ranks.all_reduce(y)


class VocabParallelEmbedding(nn.Module):
    def __init__(self, table: nn.Embedding, rank: int, world: int):
        super().__init__()
        self.rows = _share(table.num_embeddings, rank, world, "the vocabulary size")
        self.weight = nn.Parameter(table.weight.data[self.rows].contiguous(), requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.rows.start
        mine = (local >= 0) & (local < self.weight.shape[0])
        out = F.embedding(local.clamp(0, self.weight.shape[0] - 1), self.weight).masked_fill(~mine[..., None], 0)
        return ranks.all_reduce(out)  # (one rank's row + zeros: exact)


class VocabParallelHead(nn.Module):
    def __init__(self, head: nn.Linear, rank: int, world: int):
        super().__init__()
        self.vocab = head.out_features
        n = -(-self.vocab // world)
        w = F.pad(head.weight.data, (0, 0, 0, n * world - self.vocab))[rank * n : (rank + 1) * n]
        self.weight = nn.Parameter(w.contiguous(), requires_grad=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return ranks.all_gather_columns(F.linear(h, self.weight))[:, : self.vocab]


def _shard_attention(attn: nn.Module, rank: int, world: int) -> None:
    d = attn.head_dim
    heads = _share(attn.num_heads, rank, world, "the attention heads")
    kv = _share(attn.num_kv_heads, rank, world, "the KV heads")
    _keep(attn.q_proj, rows=slice(heads.start * d, heads.stop * d))
    _keep(attn.k_proj, rows=slice(kv.start * d, kv.stop * d))
    _keep(attn.v_proj, rows=slice(kv.start * d, kv.stop * d))
    _keep(attn.o_proj, cols=slice(heads.start * d, heads.stop * d))
    attn.num_heads, attn.num_kv_heads = heads.stop - heads.start, kv.stop - kv.start


def _shard_mlp(mlp: GatedMLP, rank: int, world: int) -> None:
    part = _share(mlp.gate_proj.out_features, rank, world, "an MLP's intermediate size")
    _keep(mlp.gate_proj, rows=part)
    _keep(mlp.up_proj, rows=part)
    _keep(mlp.down_proj, cols=part)


def _shard_moe(moe: SparseMoE, rank: int, world: int) -> None:
    e = moe.experts
    inter = e.down_proj.shape[2]
    part = _share(inter, rank, world, "the experts' intermediate size")
    up = slice(inter + part.start, inter + part.stop)
    gate_up = torch.cat([e.gate_up_proj.data[:, part], e.gate_up_proj.data[:, up]], dim=1)
    e.gate_up_proj = nn.Parameter(gate_up.contiguous(), requires_grad=False)
    e.down_proj = nn.Parameter(e.down_proj.data[:, :, part].contiguous(), requires_grad=False)
    if moe.shared_expert is not None:  # (its sigmoid gate is replicated: it scales each rank's share alike)
        _shard_mlp(moe.shared_expert, rank, world)


def shard_decoder(module: nn.Module, rank: int, world: int) -> None:
    """Cut a loaded language model (``embed_tokens``, decoder ``layers`` of ``self_attn`` + ``mlp``,
    ``lm_head``) to rank ``rank``'s share of ``world``, in place."""
    for name, child in list(module.named_modules()):
        if hasattr(child, "self_attn") and hasattr(child, "mlp"):  # a decoder layer
            _shard_attention(child.self_attn, rank, world)
            mlp = child.mlp
            (_shard_moe if isinstance(mlp, SparseMoE) else _shard_mlp)(mlp, rank, world)
            child.self_attn, child.mlp = ReducedOutput(child.self_attn), ReducedOutput(mlp)
        elif isinstance(child, nn.Embedding) and name.endswith("embed_tokens"):
            _replace(module, name, VocabParallelEmbedding(child, rank, world))
        elif isinstance(child, nn.Linear) and name == "lm_head":
            _replace(module, name, VocabParallelHead(child, rank, world))


def _replace(root: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, leaf, new)


def local_heads(cfg, world: int):
    """A decoder config with one rank's share of the attention and KV heads (its KV pool's shape)."""
    if world == 1:
        return cfg
    heads = _share(cfg.num_attention_heads, 0, world, "the attention heads")
    kv = _share(cfg.num_key_value_heads, 0, world, "the KV heads")
    return dataclasses.replace(cfg, num_attention_heads=heads.stop, num_key_value_heads=kv.stop)
