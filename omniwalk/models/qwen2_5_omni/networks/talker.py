"""Qwen2.5-Omni talker (``talker.``): a dense Qwen2.5 decoder over one codec stream.

    input row  = codec embedding (``model.embed_tokens``, thinker-width) + a thinker row
               (a prompt token's embedding + last hidden state, or a reply token's)
    decoder in = thinker_to_talker_proj(input row)        [n, hidden]
    logits     = codec_head(model.norm(decoder(...)))     [n, codec vocab]

Module names mirror the checkpoint (``thinker_to_talker_proj``, ``model.layers.N.*``, ``codec_head``).
"""

from __future__ import annotations

import torch
from torch import nn

from omniwalk.layers.decoder import Decoder, KVCache
from omniwalk.models.qwen2_5_omni.checkpoint.config import TalkerConfig


class TalkerModel(Decoder):
    def __init__(self, cfg: TalkerConfig):
        super().__init__(cfg.text)
        self.embed_tokens = nn.Embedding(cfg.text.vocab_size, cfg.embedding_size)


class Talker(nn.Module):
    def __init__(self, cfg: TalkerConfig):
        super().__init__()
        self.cfg = cfg
        self.thinker_to_talker_proj = nn.Linear(cfg.embedding_size, cfg.text.hidden_size)
        self.model = TalkerModel(cfg)
        self.codec_head = nn.Linear(cfg.text.hidden_size, cfg.text.vocab_size, bias=False)

    def forward(self, rows: torch.Tensor, positions: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Input rows [n, embedding_size] at TMRoPE ``positions`` [3, n] -> codec logits [n, vocab]."""
        return self.codec_head(self.model(self.thinker_to_talker_proj(rows), positions, cache))
