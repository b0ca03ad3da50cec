"""Thinker outputs -> the talker's prompt (HF ``Qwen3OmniMoeForConditionalGeneration._get_talker_user_parts``
and ``_get_talker_assistant_parts``).

Inputs are per thinker position (prompt, then generated tokens the thinker ran):
``embeddings`` E (decoder input embeddings) and ``accept_hidden`` Hh (output of thinker layer
``accept_hidden_layer - 1``). The talker prompt is

    user part     every position of every user turn (``<|im_start|>user`` .. ``<|im_end|>\\n``), in order;
                  system turns and earlier assistant turns are dropped.
                  media pad positions: hidden_projection(Hh);  text positions: text_projection(E)
    header        9 positions from the last ``<|im_start|>assistant`` (index a), A = text_projection(E[a:]):

                  pos   text stream          codec stream (talker codec_embedding)
                  0-2   A[0:3]               0
                  3-6   tts_pad              nothink, think_bos, think_eos, speaker
                  7     tts_bos              codec pad
                  8     A[3] (1st answer)    codec bos

    text stream   A[4:] (answer tokens 1.., stopping before a thinker EOS), then tts_eos once;
                  the talker adds tts_pad after that.

Rope positions come from ``mrope_positions`` over the kept media spans (HF's talker
``get_rope_index``): 3-D when a user turn holds an image or video, sequential otherwise.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from omniwalk.device import to_device
from omniwalk.errors import InvalidRequestError
from omniwalk.models.common.checkpoint.config import TokenIds
from omniwalk.models.common.processing.positions import MediaSpan, RopePositions, mrope_positions
from omniwalk.models.qwen3_omni.checkpoint.config import CodecIds
from omniwalk.models.qwen3_omni.networks.talker import Talker

NUM_HEADER_TEXT = 3  # <|im_start|> assistant \n


def resolve_speaker(speakers: dict[str, int], voice: str | None, default: str = "ethan") -> int:
    """Codec id of ``voice`` (case-insensitive); None picks ``default`` (or the first voice)."""
    if voice is None:
        return speakers.get(default, next(iter(speakers.values())))
    speaker = speakers.get(voice.lower())
    if speaker is None:
        raise InvalidRequestError(f"unknown voice {voice!r}; available voices: {', '.join(sorted(speakers))}")
    return speaker


def user_positions(ids: list[int], tokens: TokenIds) -> torch.Tensor:
    """Bool [len(ids)]: positions inside a user turn (the role is the token after the last <|im_start|>, none
    for an <|im_start|> that ends the ids). Array work, not a loop: made at every turn of a conversation."""
    ids = np.asarray(ids, dtype=np.int64)
    starts = np.flatnonzero(ids == tokens.im_start)
    roles = np.append(ids, -1)[starts + 1]  # (-1: no token after the last start)
    turn = np.searchsorted(starts, np.arange(len(ids)), side="right") - 1  # the last start at or before each
    return torch.from_numpy((turn >= 0) & (np.append(roles, -1)[turn] == tokens.user))


def last_assistant_start(ids: list[int], tokens: TokenIds) -> int:
    for i in range(len(ids) - 2, -1, -1):
        if ids[i] == tokens.im_start and ids[i + 1] == tokens.assistant:
            return i
    raise InvalidRequestError("speech output needs a prompt that ends with an assistant turn header")


def kept_spans(spans: list[MediaSpan], keep: torch.Tensor) -> list[MediaSpan]:
    """Spans inside kept positions, re-indexed to the talker prompt (spans in dropped turns vanish)."""
    new_index = torch.cumsum(keep.long(), 0) - 1
    return [
        dataclasses.replace(s, start=int(new_index[s.start]))
        for s in spans
        if bool(keep[s.start : s.start + s.length].all())
    ]


def _header(talker: Talker, answer: torch.Tensor, special: dict[str, torch.Tensor], speaker: int, codec: CodecIds):
    """The 9 assistant-header inputs [9, hidden]: projected text stream + codec stream."""
    text = torch.cat(
        [answer[:NUM_HEADER_TEXT], special["pad"].expand(4, -1), special["bos"][None], answer[NUM_HEADER_TEXT:][:1]]
    )
    codec_ids = torch.tensor([codec.nothink, codec.think_bos, codec.think_eos, speaker, codec.pad, codec.bos])
    codec_part = talker.model.codec_embedding(to_device(codec_ids, text.device))
    return text + torch.cat([codec_part.new_zeros(NUM_HEADER_TEXT, codec_part.shape[1]), codec_part])


@torch.inference_mode()
def talker_prefix(
    talker: Talker,
    tokens: TokenIds,
    *,
    prompt_ids: list[int],
    embeddings: torch.Tensor,
    accept_hidden: torch.Tensor,
    first_answer: torch.Tensor,
    special_embeddings: torch.Tensor,
    spans: list[MediaSpan],
    speaker: int,
    position_id_per_seconds: float,
) -> tuple[torch.Tensor, RopePositions]:
    """The talker's prefill inputs [P, hidden] (user part + 9-position header) and their positions.

    ``embeddings`` / ``accept_hidden`` [len(prompt_ids), thinker_hidden] cover the thinker prompt;
    ``first_answer`` [thinker_hidden] is the thinker input embedding of the first generated token;
    ``special_embeddings`` [3, thinker_hidden] are those of (tts_bos, tts_eos, tts_pad).
    """
    p = talker.codec_head.weight
    embeddings, accept_hidden = embeddings.to(p), accept_hidden.to(p)
    bos, _, pad = talker.text_projection(special_embeddings.to(p)).unbind(0)
    # Masks and row indices are built on the host (the ids are host data): no device reads.
    user = user_positions(prompt_ids, tokens)
    media = torch.isin(torch.tensor(prompt_ids), torch.tensor(tokens.media_pads))
    user_media = media[user]

    def rows(mask: torch.Tensor) -> torch.Tensor:
        return to_device(mask.nonzero().flatten(), p.device, torch.long)

    user_part = torch.empty(int(user.sum()), p.shape[1], dtype=p.dtype, device=p.device)
    user_part.index_copy_(0, rows(user_media), talker.hidden_projection(accept_hidden[rows(user & media)]))
    user_part.index_copy_(0, rows(~user_media), talker.text_projection(embeddings[rows(user & ~media)]))

    start = last_assistant_start(prompt_ids, tokens)
    answer = talker.text_projection(torch.cat([embeddings[start:], first_answer.to(p)[None]]))
    header = _header(talker, answer, {"bos": bos, "pad": pad}, speaker, talker.cfg.codec)
    inputs = torch.cat([user_part, header])
    positions = mrope_positions(inputs.shape[0], kept_spans(spans, user), position_id_per_seconds)
    return inputs, positions


def talker_prefix_length(prompt_ids: list[int], tokens: TokenIds) -> int:
    """Rows ``talker_prefix`` returns: every user-turn position plus the 9-position header."""
    return int(user_positions(prompt_ids, tokens).sum()) + NUM_HEADER_TEXT + 6
