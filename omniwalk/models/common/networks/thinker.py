"""The thinker language model: embedding + multimodal scatter, DeepStack, decoder (MoE or dense), lm_head.

Module names mirror the checkpoint under ``thinker.`` (``model.embed_tokens``, ``model.layers.N.*``,
``model.norm``, ``lm_head``); the audio and vision encoders (``thinker.audio_tower`` /
``thinker.visual``) are separate modules, and their outputs come in as ``MediaEmbeddings``.

One ``forward`` call runs a block of new tokens of one request (a whole prompt, or one decode
token) against that request's ``KVCache``. For the talker it can also return, per token,
the decoder input embedding and the output of layer ``accept_hidden_layer - 1`` (taken before
that layer's DeepStack addition), without keeping any other layer's states.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
from torch import nn

from omniwalk.errors import InvalidRequestError
from omniwalk.layers.decoder import Decoder, DecoderConfig, KVCache
from omniwalk.layers.linear import LoraRows
from omniwalk.modality import MEDIA, Modality
from omniwalk.models.common.checkpoint.config import TokenIds


@dataclass
class MediaEmbeddings:
    """Encoder outputs of a prompt (or a packed batch of chunks), per modality present; rows are
    in prompt order of their placeholder tokens.

    ``rows[kind]`` [num placeholders of ``kind``, hidden]; ``deepstack[kind]`` (image, video)
    [levels, rows, hidden]: the vision encoder's extra taps, added to the hidden state after
    decoder layers 0..levels-1 at that modality's positions.
    """

    rows: dict[Modality, torch.Tensor] = field(default_factory=dict)
    deepstack: dict[Modality, torch.Tensor] = field(default_factory=dict)


@dataclass
class ThinkerOutput:
    logits: torch.Tensor  # [n, vocab] (or [1, vocab]: the last token only)
    embeddings: torch.Tensor | None = None  # [n, hidden] decoder input (after scatter, before DeepStack)
    accept_hidden: torch.Tensor | None = None  # [n, hidden] output of layer accept_hidden_layer - 1


class ThinkerModel(Decoder):
    def __init__(self, cfg: DecoderConfig, moe_backend: str = "reference"):
        super().__init__(cfg, moe_backend)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)


class Thinker(nn.Module):
    """``deepstack``: vision placeholders take DeepStack rows too (the vision encoder's extra taps)."""

    def __init__(
        self, cfg: DecoderConfig, tokens: TokenIds, accept_hidden_layer: int, moe_backend="reference", deepstack=True
    ):
        super().__init__()
        self.cfg, self.tokens, self.accept_hidden_layer = cfg, tokens, accept_hidden_layer
        self.has_deepstack = deepstack
        self.model = ThinkerModel(cfg, moe_backend)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def embed(self, input_ids: torch.Tensor, media: MediaEmbeddings | None = None, counts: dict | None = None):
        """ids [n] -> (embeddings [n, hidden], DeepStack additions [levels, n, hidden] or None).

        Each placeholder run is filled with its encoder rows; a count mismatch is an
        ``InvalidRequestError`` naming the modality. ``counts`` (placeholders per modality in
        ``input_ids``, known on the host by the engine) avoids reading them back from the device.
        """
        x = self.model.embed_tokens(input_ids)
        if media is None:
            return x, None
        masks, found = {}, {}
        for name, token in zip(MEDIA, self.tokens.media_pads, strict=True):
            rows = media.rows.get(name)
            masks[name] = mask = input_ids == token
            found[name] = count = counts[name] if counts is not None else int(mask.sum())
            num_rows = 0 if rows is None else rows.shape[0]
            if count != num_rows:
                raise InvalidRequestError(
                    f"{name} placeholder/feature mismatch: the prompt has {count} {name} placeholder tokens "
                    f"but the {name} encoder produced {num_rows} embeddings"
                )
            if count:
                x = x.masked_scatter(mask[:, None], rows.to(x.dtype))
        return x, _deepstack_additions(masks, found, media, x) if self.has_deepstack else None

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        media: MediaEmbeddings | None = None,
        *,
        all_logits: bool = False,
        talker_states: bool = False,
        counts: dict | None = None,
        lora: LoraRows | None = None,
    ) -> ThinkerOutput:
        """Run new tokens ``input_ids`` [n] at rope ``positions`` ([3, n] or [n]) after ``cache``'s tokens
        (``lora``: the rows' LoRA adapters; None: the base model)."""
        x, deepstack = self.embed(input_ids, media, counts)
        captured: dict[str, torch.Tensor] = {}
        capture_at = self.accept_hidden_layer - 1 if talker_states else -1

        def hook(layer: int, h: torch.Tensor) -> torch.Tensor:
            if layer == capture_at:
                captured["h"] = h
            if deepstack is not None and layer < deepstack.shape[0]:
                h = h + deepstack[layer]  # zero outside image/video positions
            return h

        layers = set(range(deepstack.shape[0] if deepstack is not None else 0)) | {capture_at} - {-1}
        h = self.model(x, positions, cache, {i: functools.partial(hook, i) for i in layers}, lora=lora)
        logits = self.lm_head(h if all_logits else h[-1:])  # every row's, or the last one's
        return ThinkerOutput(logits, x if talker_states else None, captured.get("h"))


def _deepstack_additions(masks: dict, found: dict, media: MediaEmbeddings, x: torch.Tensor):
    """Image and video DeepStack rows placed at their positions -> [levels, n, hidden] (zeros
    elsewhere), or None without vision tokens. Built with masked scatters: no host reads."""
    parts = [(masks[kind], media.deepstack.get(kind)) for kind in (Modality.IMAGE, Modality.VIDEO) if found[kind]]
    if not parts:
        return None
    if any(ds is None for _, ds in parts):
        raise InvalidRequestError("vision placeholders are present but DeepStack features are missing")
    levels = parts[0][1].shape[0]
    full = x.new_zeros(levels, x.shape[0], x.shape[1])
    for mask, ds in parts:
        full = full.masked_scatter(mask[None, :, None], ds.to(x.dtype))
    return full
