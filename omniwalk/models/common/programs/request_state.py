"""Per-request state of an omni walk, owned by the model programs (the engine never looks in).

Built once from a processed request (prompt, measured media, sampling parameters). Each stage
reads what the stages before it produced and writes its own part:

    media       encoder outputs per item            audio / vision encoder programs
    thinker     seq = prompt + generated ids, ...   thinker program
    talker      the family's talker state           talker program (speech only)
    vocoder     the family's vocoder state          vocoder program (speech only)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omniwalk.errors import InvalidRequestError
from omniwalk.models.common.networks.thinker import MediaEmbeddings
from omniwalk.models.common.processing.chat import Prompt
from omniwalk.models.common.processing.positions import AUDIO, AUDIO_IN_VIDEO, IMAGE, VIDEO, MediaSpan
from omniwalk.sampling import SamplerState, SamplingParams, TokenLogprob
from omniwalk.structured.grammars import TOOL_CALL_START, check_tools, constraint_of
from omniwalk.structured.matchers import Grammars
from omniwalk.tokenizer import IncrementalDetokenizer, Tokenizer


@dataclass
class MediaState:
    """Encoder inputs and outputs of one request, in prompt order per modality.

    Items whose placeholders all lie in the prompt's prefix that the thinker takes from keyed pages
    are skipped: no step reads their rows (``skip``; a leading run of each list). The thinker lowers
    the skip when it takes less than it expected (pages evicted meanwhile, or a preempted request's
    prefix gone): the encoders then encode those items late."""

    waves: list[np.ndarray]  # audio clips and (audio-in-video) video audio tracks, in prompt order
    vision: list  # MediaItem of every image and video, in prompt order
    audio_out: list[torch.Tensor | None] = field(default_factory=list)
    vision_out: list[tuple[torch.Tensor, list[torch.Tensor]] | None] = field(default_factory=list)
    num_skipped_audio: int = 0
    num_skipped_vision: int = 0
    skip_end: int = 0  # the prompt position where the skipped items' placeholders end (0: none skipped)

    def __post_init__(self):
        self.audio_out = [None] * len(self.waves)
        self.vision_out = [None] * len(self.vision)

    def skip(self, spans: list[MediaSpan], num_tokens: int) -> None:
        """Skip the items whose placeholders all lie before prompt position ``num_tokens`` (``spans``:
        the prompt's, in prompt order; an audio-in-video span has a wave and a vision item)."""
        k = 0
        while k < len(spans) and spans[k].start + spans[k].length <= num_tokens:
            k += 1
        self.num_skipped_audio = sum(span.kind in (AUDIO, AUDIO_IN_VIDEO) for span in spans[:k])
        self.num_skipped_vision = sum(span.kind != AUDIO for span in spans[:k])
        self.skip_end = spans[k - 1].start + spans[k - 1].length if k else 0

    @property
    def pending_audio(self) -> list[int]:
        """The audio items still to encode."""
        return [i for i in range(self.num_skipped_audio, len(self.waves)) if self.audio_out[i] is None]

    @property
    def pending_vision(self) -> list[int]:
        return [i for i in range(self.num_skipped_vision, len(self.vision)) if self.vision_out[i] is None]

    @property
    def has_skipped(self) -> bool:
        return bool(self.num_skipped_audio or self.num_skipped_vision)

    @property
    def is_encoded(self) -> bool:
        return not self.pending_audio and not self.pending_vision

    def embeddings(self) -> MediaEmbeddings | None:
        """Assemble the thinker's media rows (placeholder order within each modality) of the items
        not skipped: rows of a kind start at its first placeholder past ``skip_end``."""
        audio_out = self.audio_out[self.num_skipped_audio :]
        vision = list(zip(self.vision, self.vision_out, strict=True))[self.num_skipped_vision :]
        if not audio_out and not vision:
            return None
        media = MediaEmbeddings({AUDIO: torch.cat(audio_out)} if audio_out else {})
        for kind in (IMAGE, VIDEO):
            outs = [o for item, o in vision if item.kind == kind]
            if outs:
                media.rows[kind] = torch.cat([main for main, _ in outs])
                levels = list(zip(*[deep for _, deep in outs], strict=True))
                if levels:  # (an encoder without DeepStack taps has none)
                    media.deepstack[kind] = torch.stack([torch.cat(level) for level in levels])
        return media


@dataclass
class ThinkerState:
    prompt: Prompt
    params: SamplingParams
    sampler: SamplerState
    detok: IncrementalDetokenizer
    max_tokens: int  # params.max_tokens capped by the context length
    seq: list[int]  # prompt + generated ids read back (committed)
    # ids sampled after ``seq`` but not read back yet: (device tensor of a draw, row), oldest first.
    # The KV holds a prefix of seq + inflight; the next step feeds them from the device.
    inflight: list[tuple[torch.Tensor, int]] = field(default_factory=list)
    picks: list[TokenLogprob] = field(default_factory=list)
    text: str = ""  # emitted text (cut before a stop string)
    finish_reason: str | None = None
    media: MediaEmbeddings | None = None  # assembled once every encoder is done
    placeholders_before: dict[str, np.ndarray] | None = None  # kind -> #placeholders in seq[:i]
    # For the talker: the thinker prompt's decoder input embeddings and accept-layer hidden states.
    prompt_embeddings: torch.Tensor | None = None
    prompt_accept_hidden: torch.Tensor | None = None
    # Token ids committed as the answer instead of the first draw (ending with a stop token), so
    # the talker voices exactly this text (/v1/audio/speech); None = generate as usual.
    forced_answer: list[int] | None = None
    # The request asked for speech: its talker reads the prompt rows, so it takes prefix pages only where the
    # thinker keeps those rows beside its keys (``ThinkerProgram.keeps_prompt_rows``). Set from the request on
    # every tensor-parallel rank alike (a follower rank builds no talker: state.talker is None).
    speaks: bool = False
    # The id that opens a tool call (requests with tools; None otherwise) and the index in ``generated``
    # of the first one the model wrote: speech ends there (a call is never voiced).
    tool_call_start: int | None = None
    tool_call_at: int | None = None
    # The LoRA adapter the thinker runs with (None: the base model): its name, the key of its load (its
    # prefix pages are keyed by it), and the pool slot it holds while the request runs (-1: none held yet).
    lora: str | None = None
    lora_key: str | None = None
    lora_slot: int = -1

    @property
    def spoken(self) -> list[int]:
        """The generated ids speech follows: all of them, or those up to the first tool call, its
        opening id included (where speech ends, as at the end of the turn)."""
        return self.generated if self.tool_call_at is None else self.generated[: self.tool_call_at + 1]

    @property
    def speech_ended(self) -> bool:
        """No more ids for speech: the thinker finished, or wrote a tool call."""
        return self.is_finished or self.tool_call_at is not None

    @property
    def num_generated(self) -> int:
        """Generated ids read back (committed)."""
        return len(self.seq) - self.prompt.num_prompt_tokens

    @property
    def num_tokens(self) -> int:
        """Prompt + generated ids, those still on the device included: the sequence the KV follows."""
        return len(self.seq) + len(self.inflight)

    @property
    def num_sampled(self) -> int:
        return self.num_generated + len(self.inflight)

    @property
    def generated(self) -> list[int]:
        return self.seq[self.prompt.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class OmniRequestState:
    media: MediaState
    thinker: ThinkerState
    talker: Any = None  # the family's talker state (speech requests)
    vocoder: Any = None  # the family's vocoder state (speech requests)
    use_audio_in_video: bool = False


def constrain(st: ThinkerState, request: dict, grammars: Grammars, tokenizer: Tokenizer) -> None:
    """The request's output grammar (``structured/grammars.py``), if any, on its thinker's sampler, and
    where its tool calls begin (requests with tools the model may call)."""
    constraint = constraint_of(request)
    if constraint is not None:
        if st.params.min_tokens:
            raise InvalidRequestError(f"min_tokens cannot be combined with {constraint.param}", "min_tokens")
        st.sampler.grammar = grammars.start(constraint)
    if request.get("tools") and request.get("tool_choice") != "none":
        st.tool_call_start = tokenizer.token_to_id(TOOL_CALL_START)


def prompt_tools(request: dict, processor) -> dict:
    """The chat template's ``tools`` for a request, as keyword arguments of ``ChatProcessor.tokenize``
    (none without tools); a template without tools support refuses them. (Their schemas are checked by
    ``constrain``'s ``constraint_of``, once.)"""
    tools = check_tools(request, schemas=False)
    if not tools:
        return {}
    if not processor.supports_tools:
        raise InvalidRequestError("this model's chat template has no tools support", "tools")
    return {"tools": tools}


def grammars_for(config, tokenizer_dir, vocab: int, eos_ids: tuple[int, ...]) -> Grammars:
    """The thinker's grammar engine, from the engine config's knobs (``config``: an ``OmniConfig``)."""
    engine = config.engine
    return Grammars(
        Path(tokenizer_dir) / "tokenizer.json",
        vocab,
        eos_ids,
        cache_size=engine.grammar_cache_size,
        threads=engine.grammar_threads,
        timeout_s=engine.grammar_timeout_s,
        synchronous=config.model.tensor_parallel > 1,
    )
