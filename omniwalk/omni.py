"""``Omni``: the offline, in-process API (single request at a time, unbatched for now).

    omni = Omni(model="CKPT_DIR", device="cpu", dtype="float32")
    out = omni.generate({"messages": [...], "max_tokens": 64, "temperature": 0.0})
    out.prompt_token_ids, out.token_ids, out.text, out.finish_reason, out.logprobs
    out.audio, out.codes            # with "modalities": ["text", "audio"]

``generate`` takes one request dict (-> ``RequestOutput``) or a list (-> list). Request keys:
``messages``, ``modalities`` (["text"] or ["text", "audio"]), the ``SamplingParams`` fields,
``voice`` and the ``TalkerSamplingParams`` fields for speech, ``use_audio_in_video`` and
``use_default_system_prompt`` (default true). The engine issue replaces the inside of
``_generate_one`` with scheduled, batched execution; this surface stays.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from omniwalk.config import OmniConfig
from omniwalk.errors import InvalidRequestError
from omniwalk.models.qwen3_omni.config import Qwen3OmniConfig
from omniwalk.models.qwen3_omni.decoder import ContiguousKVCache
from omniwalk.models.qwen3_omni.media_inputs import encode, measure
from omniwalk.models.qwen3_omni.model import Backends, load_components
from omniwalk.models.qwen3_omni.processor import ChatProcessor, MediaPart, Prompt
from omniwalk.models.qwen3_omni.speech import synthesize
from omniwalk.models.qwen3_omni.talker import TalkerSamplingParams
from omniwalk.models.qwen3_omni.talker_prompt import resolve_speaker
from omniwalk.models.qwen3_omni.thinker import MediaEmbeddings
from omniwalk.sampling import Sampler, SamplingParams, TokenLogprob
from omniwalk.tokenizer import Tokenizer


@dataclass
class RequestOutput:
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated ids, including a final EOS / stop token when one ended the request
    text: str  # special tokens skipped; cut before the first stop string
    finish_reason: str  # "stop" (EOS, stop token or stop string) or "length"
    logprobs: list[TokenLogprob] | None = None
    audio: torch.Tensor | None = None  # float32 mono at 24 kHz, when "audio" was requested
    codes: torch.Tensor | None = None  # int64 [frames, code groups], complete frames only


class Omni:
    def __init__(self, model: str, **options):
        """``options`` are ``ModelConfig`` fields (device, dtype, max_model_len, default_system_prompt, ...)."""
        self.config = OmniConfig.from_kwargs(model=os.path.expanduser(str(model)), **options)
        mc = self.config.model
        self.model_config = Qwen3OmniConfig.from_hf(mc.model)
        self.tokenizer = Tokenizer.from_dir(mc.model)
        self.processor = ChatProcessor(self.model_config, self.tokenizer, mc.default_system_prompt)
        cfg = self.model_config
        names = ("thinker", "audio_encoder", "vision_encoder")
        names += ("talker", "code2wav") if cfg.enable_audio_output else ()
        parts = load_components(
            mc.model, names, dtype=mc.torch_dtype, device=mc.device, backends=Backends(moe=mc.moe_backend), cfg=cfg
        )
        self.thinker, self.audio_tower, self.visual = parts["thinker"], parts["audio_encoder"], parts["vision_encoder"]
        self.talker, self.code2wav = parts.get("talker"), parts.get("code2wav")
        self.max_model_len = mc.max_model_len or cfg.text.max_position_embeddings

    def generate(self, requests: dict | list[dict]) -> RequestOutput | list[RequestOutput]:
        if isinstance(requests, dict):
            return self._generate_one(requests)
        return [self._generate_one(r) for r in requests]

    def prompt(self, request: dict) -> tuple[Prompt, MediaEmbeddings | None]:
        """Request -> thinker prompt (ids, spans, MRoPE positions) and its encoder outputs."""
        if not isinstance(request, dict) or "messages" not in request:
            raise InvalidRequestError("a request is a dict with 'messages'")
        ids, parts = self.processor.tokenize(request["messages"], bool(request.get("use_default_system_prompt", True)))
        if parts:
            return self._encode_media(ids, parts, bool(request.get("use_audio_in_video", False)))
        return self.processor.build(ids, []), None

    def _encode_media(self, ids: list[int], parts: list[MediaPart], use_audio_in_video: bool):
        mc = self.config.model
        items = [measure(part, self.model_config.audio.n_window) for part in parts]
        prompt = self.processor.build(ids, items, use_audio_in_video)
        embeddings = encode(items, self.audio_tower, self.visual, use_audio_in_video, mc.torch_dtype, mc.device)
        return prompt, embeddings

    @torch.inference_mode()
    def _generate_one(self, request: dict) -> RequestOutput:
        speak = self._wants_audio(request)
        params = SamplingParams.from_request(request)
        speech = TalkerSamplingParams.from_request(request) if speak else None
        if speak:  # an unknown voice fails before any work
            resolve_speaker(self.model_config.talker.speaker_ids, request.get("voice"))
        prompt, media = self.prompt(request)
        room = self.max_model_len - prompt.num_prompt_tokens
        if room < 1:
            raise InvalidRequestError(
                f"the prompt has {prompt.num_prompt_tokens} tokens; the context length is {self.max_model_len}"
            )
        out, states = self._decode(prompt, media, params, min(params.max_tokens, room), speak)
        if speak:
            spoken = synthesize(
                self.talker,
                self.code2wav,
                self.model_config,
                self.thinker.model.embed_tokens,
                prompt_ids=prompt.token_ids,
                generated_ids=out.token_ids,
                embeddings=torch.cat([e for e, _ in states]),
                accept_hidden=torch.cat([h for _, h in states]),
                spans=prompt.spans,
                voice=request.get("voice"),
                params=speech,
            )
            out.audio, out.codes = spoken.audio, spoken.codes
        return out

    def _wants_audio(self, request: dict) -> bool:
        modalities = request.get("modalities") or ["text"]
        if not isinstance(modalities, list) or sorted(modalities) not in (["text"], ["audio", "text"]):
            raise InvalidRequestError(f"modalities must be ['text'] or ['text', 'audio'], got {modalities!r}")
        if "audio" in modalities and self.talker is None:
            raise InvalidRequestError("this checkpoint has no audio output (enable_audio_output is false)")
        return "audio" in modalities

    def _decode(self, prompt: Prompt, media, params: SamplingParams, max_tokens: int, speak: bool):
        """Greedy/sampled thinker decoding. With ``speak``, also returns the talker's inputs: per
        forward, (decoder input embeddings, accept-layer hidden states); the final token is never
        fed back, so they cover prompt + generated[:-1], as HF's ``generate`` does."""
        device = self.config.model.device
        cfg = self.model_config
        kv = ContiguousKVCache.for_config(cfg.text, self.config.model.torch_dtype, device)
        sampler = Sampler(params, (cfg.tokens.im_end,), prompt.token_ids, device)
        detok = self.tokenizer.detokenizer()
        states = []
        ids = torch.tensor(prompt.token_ids, device=device)
        positions = prompt.rope.positions.to(device)
        picks: list[TokenLogprob] = []
        while True:
            result = self.thinker(ids, positions, kv, media, talker_states=speak)
            media = None  # media only scatters into the prompt
            if speak:
                states.append((result.embeddings, result.accept_hidden))
            picks.append(sampler(result.logits[-1]))
            token = picks[-1].token_id
            if sampler.is_stop_token(token):
                return self._output(prompt, picks, detok.text + detok.flush(), "stop", params), states
            detok.add([token])
            cut = _find_stop(detok.text, params.stop)
            if cut is not None:
                return self._output(prompt, picks, detok.text[:cut], "stop", params), states
            if len(picks) == max_tokens:
                return self._output(prompt, picks, detok.text + detok.flush(), "length", params), states
            positions = prompt.rope.decode(prompt.num_prompt_tokens + len(picks) - 1).to(device)
            ids = torch.tensor([token], device=device)

    @staticmethod
    def _output(prompt: Prompt, picks: list[TokenLogprob], text: str, reason: str, params) -> RequestOutput:
        return RequestOutput(
            prompt.token_ids, [p.token_id for p in picks], text, reason, picks if params.logprobs else None
        )


def _find_stop(text: str, stops: tuple[str, ...]) -> int | None:
    """Index where the earliest stop string begins in ``text``, or None."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None
