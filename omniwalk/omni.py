"""``Omni``: the in-process API over the walk runtime (continuous batching across requests).

    omni = Omni(model="CKPT_DIR", device="cpu", dtype="float32")
    out = omni.generate({"messages": [...], "max_tokens": 64, "temperature": 0.0})
    out.prompt_token_ids, out.token_ids, out.text, out.finish_reason, out.logprobs
    out.audio, out.codes            # with "modalities": ["text", "audio"]
    for event in omni.stream(request): ...    # Event("text", str) / Event("audio", float32 chunk)
    omni.abort(request_id)

``generate`` takes one request dict (-> ``RequestOutput``) or a list (-> list, run concurrently).
Request keys: ``messages``, ``modalities`` (["text"] or ["text", "audio"]), the ``SamplingParams``
fields, ``voice`` and the ``TalkerSamplingParams`` fields for speech, ``use_audio_in_video``,
``use_default_system_prompt`` (default true), ``forced_answer`` (a text the thinker answers with
instead of generating: the talker speaks exactly it) and an optional ``request_id``. Invalid requests
raise ``InvalidRequestError`` before anything runs; a request that fails while running ends
with ``finish_reason == "error"`` and its ``error``, and no other request is affected.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from omniwalk.config import OmniConfig
from omniwalk.engine.engine import Engine, EngineLimits
from omniwalk.engine.request import EngineRequest, Event, Status
from omniwalk.errors import InvalidRequestError
from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig
from omniwalk.models.qwen3_omni.checkpoint.loader import Backends, load_components
from omniwalk.models.qwen3_omni.networks.talker import TalkerSamplingParams
from omniwalk.models.qwen3_omni.processing.chat import ChatProcessor, Prompt
from omniwalk.models.qwen3_omni.processing.media_inputs import measure
from omniwalk.models.qwen3_omni.processing.talker_prompt import resolve_speaker
from omniwalk.models.qwen3_omni.programs.stages import build_stages, new_state
from omniwalk.sampling import SamplingParams, TokenLogprob
from omniwalk.tokenizer import Tokenizer


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated ids, including a final EOS / stop token when one ended the request
    text: str  # special tokens skipped; cut before the first stop string
    finish_reason: str  # "stop" (EOS, stop token or stop string), "length", "abort" or "error"
    logprobs: list[TokenLogprob] | None = None
    audio: torch.Tensor | None = None  # float32 mono at 24 kHz, when "audio" was requested
    codes: torch.Tensor | None = None  # int64 [frames, code groups], complete frames only
    error: str | None = None


class Omni:
    def __init__(self, model: str, **options):
        """``options`` are ``ModelConfig`` and ``EngineConfig`` fields (device, dtype, max_model_len, ...)."""
        self.config = OmniConfig.from_kwargs(model=os.path.expanduser(str(model)), **options)
        mc = self.config.model
        self.model_config = cfg = Qwen3OmniConfig.from_hf(mc.model)
        self.tokenizer = Tokenizer.from_dir(mc.model)
        self.processor = ChatProcessor(cfg, self.tokenizer, mc.default_system_prompt)
        names = ("thinker", "audio_encoder", "vision_encoder") + (
            ("talker", "code2wav") if cfg.enable_audio_output else ()
        )
        self.parts = load_components(
            mc.model,
            names,
            dtype=mc.torch_dtype,
            device=mc.device,
            backends=Backends(*(mc.backend(f"{kind}_backend") for kind in ("attention", "moe", "norm"))),
            cfg=cfg,
            random_seed=0 if mc.random_weights else None,
        )
        stages = build_stages(self.parts, cfg, self.config.engine, mc)
        self.engine = Engine(stages, EngineLimits(self.config.engine.max_requests))
        self.engine.capture_graphs()
        self.max_model_len = mc.max_model_len or cfg.text.max_position_embeddings
        self._ids = itertools.count()

    def generate(self, requests: dict | list[dict]) -> RequestOutput | list[RequestOutput]:
        single = isinstance(requests, dict)
        reqs = [self.add(r) for r in ([requests] if single else requests)]
        while any(not r.status.is_done for r in reqs):
            self.engine.step()
        outputs = [self.output(r) for r in reqs]
        return outputs[0] if single else outputs

    def stream(self, request: dict) -> Iterator[Event]:
        """Run one request (beside any others in flight) and yield its text and audio events."""
        req = self.add(request)
        while True:
            while req.events:
                event = req.events.popleft()
                if event.kind in ("finished", "error"):
                    if event.kind == "error":
                        raise event.data
                    return
                yield event
            self.engine.step()

    def abort(self, request_id: str) -> bool:
        return self.engine.abort(request_id)

    def prompt(self, request: dict) -> Prompt:
        """Request -> thinker prompt: ids, media spans, measured media items, MRoPE positions."""
        if not isinstance(request, dict) or "messages" not in request:
            raise InvalidRequestError("a request is a dict with 'messages'")
        ids, parts = self.processor.tokenize(request["messages"], bool(request.get("use_default_system_prompt", True)))
        items = [measure(part, self.model_config.audio.n_window, self.config.media) for part in parts]
        return self.processor.build(ids, items, bool(request.get("use_audio_in_video", False)))

    def add(self, request: dict) -> EngineRequest:
        """Validate and process a request and hand it to the engine (raises on bad input)."""
        speak = self._wants_audio(request)
        params = SamplingParams.from_request(request)
        speech = TalkerSamplingParams.from_request(request) if speak else None
        speaker = resolve_speaker(self.model_config.talker.speaker_ids, request.get("voice")) if speak else None
        prompt = self.prompt(request)
        room = self.max_model_len - prompt.num_prompt_tokens
        answer = self._forced_answer(request.get("forced_answer"))
        if room < max(1, len(answer or ())):
            raise InvalidRequestError(
                f"the prompt has {prompt.num_prompt_tokens} tokens; the context length is {self.max_model_len}"
            )
        walk, state = new_state(
            prompt,
            params,
            len(answer) if answer else min(params.max_tokens, room),
            self.tokenizer.detokenizer(),
            self.model_config,
            use_audio_in_video=bool(request.get("use_audio_in_video", False)),
            speech=speech,
            speaker=speaker,
            device=self.config.model.device,
        )
        state.thinker.forced_answer = answer
        req = EngineRequest(str(request.get("request_id") or f"req-{next(self._ids)}"), walk, state)
        self.engine.add(req)
        return req

    def _forced_answer(self, text) -> list[int] | None:
        """``forced_answer`` (text the thinker answers with instead of generating, e.g. speech of a
        given text) -> its token ids + the end of the turn."""
        if text is None:
            return None
        if not isinstance(text, str) or not text:
            raise InvalidRequestError("forced_answer must be a non-empty string")
        return self.tokenizer.encode(text) + [self.model_config.tokens.im_end]

    def _wants_audio(self, request: dict) -> bool:
        modalities = request.get("modalities") or ["text"]
        if not isinstance(modalities, list) or sorted(modalities) not in (["text"], ["audio", "text"]):
            raise InvalidRequestError(f"modalities must be ['text'] or ['text', 'audio'], got {modalities!r}")
        if "audio" in modalities and "talker" not in self.parts:
            raise InvalidRequestError("this checkpoint has no audio output (enable_audio_output is false)")
        return "audio" in modalities

    def output(self, req: EngineRequest) -> RequestOutput:
        st = req.state
        th = st.thinker
        reason = {Status.ABORTED: "abort", Status.FAILED: "error"}.get(req.status, th.finish_reason)
        out = RequestOutput(
            req.id,
            th.prompt.token_ids,
            th.generated,
            th.text,
            reason,
            th.picks if th.params.logprobs else None,
            error=None if req.error is None else f"{type(req.error).__name__}: {req.error}",
        )
        if st.talker is not None:
            frames = st.talker.frames
            out.codes = (
                torch.stack(frames)
                if frames
                else torch.zeros(0, self.model_config.talker.num_code_groups, dtype=torch.long)
            )
            out.audio = torch.cat(st.vocoder.chunks) if st.vocoder.chunks else torch.zeros(0)
        return out
