"""``Omni``: the offline, in-process API (single request at a time, unbatched for now).

    omni = Omni(model="CKPT_DIR", device="cpu", dtype="float32")
    out = omni.generate({"messages": [...], "max_tokens": 64, "temperature": 0.0})
    out.prompt_token_ids, out.token_ids, out.text, out.finish_reason, out.logprobs

``generate`` takes one request dict (-> ``RequestOutput``) or a list (-> list). Request keys:
``messages``, ``modalities`` (["text"]), the ``SamplingParams`` fields, ``use_audio_in_video``
and ``use_default_system_prompt`` (default true). The engine issue replaces the inside of
``_generate_one`` with scheduled, batched execution; this surface stays.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omniwalk.config import OmniConfig
from omniwalk.errors import InvalidRequestError
from omniwalk.models.qwen3_omni.audio_encoder import AudioEncoder
from omniwalk.models.qwen3_omni.config import Qwen3OmniConfig
from omniwalk.models.qwen3_omni.decoder import ContiguousKVCache
from omniwalk.models.qwen3_omni.media_inputs import encode, measure
from omniwalk.models.qwen3_omni.processor import ChatProcessor, MediaPart, Prompt
from omniwalk.models.qwen3_omni.thinker import MediaEmbeddings, Thinker
from omniwalk.models.qwen3_omni.vision_encoder import VisionEncoder
from omniwalk.models.qwen3_omni.weights import load_weights
from omniwalk.sampling import Sampler, SamplingParams, TokenLogprob
from omniwalk.tokenizer import Tokenizer


@dataclass
class RequestOutput:
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated ids, including a final EOS / stop token when one ended the request
    text: str  # special tokens skipped; cut before the first stop string
    finish_reason: str  # "stop" (EOS, stop token or stop string) or "length"
    logprobs: list[TokenLogprob] | None = None


class Omni:
    def __init__(self, model: str, **options):
        """``options`` are ``ModelConfig`` fields (device, dtype, max_model_len, default_system_prompt, ...)."""
        self.config = OmniConfig.from_kwargs(model=str(model), **options)
        mc = self.config.model
        self.model_config = Qwen3OmniConfig.from_hf(mc.model)
        self.tokenizer = Tokenizer.from_dir(mc.model)
        self.processor = ChatProcessor(self.model_config, self.tokenizer, mc.default_system_prompt)
        cfg = self.model_config
        with torch.device("meta"):  # parameters are created directly on the target device by the loader
            self.thinker = Thinker(cfg.text, cfg.tokens, cfg.talker.accept_hidden_layer, mc.moe_backend).eval()
        self.thinker.load(mc.model, dtype=mc.torch_dtype, device=mc.device)
        with torch.device(mc.device):  # the encoders compute buffers at construction (not in the checkpoint)
            self.audio_tower = AudioEncoder(cfg.audio).eval()
            self.visual = VisionEncoder(cfg.vision).eval()
        load_weights(self.audio_tower, mc.model, "thinker.audio_tower.", dtype=mc.torch_dtype)
        load_weights(self.visual, mc.model, "thinker.visual.", dtype=mc.torch_dtype)
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
        modalities = request.get("modalities") or ["text"]
        if modalities != ["text"]:
            raise InvalidRequestError(f"modalities {modalities} not supported yet; use ['text']")
        params = SamplingParams.from_request(request)
        prompt, media = self.prompt(request)
        room = self.max_model_len - prompt.num_prompt_tokens
        if room < 1:
            raise InvalidRequestError(
                f"the prompt has {prompt.num_prompt_tokens} tokens; the context length is {self.max_model_len}"
            )
        return self._decode(prompt, media, params, min(params.max_tokens, room))

    def _decode(self, prompt: Prompt, media, params: SamplingParams, max_tokens: int) -> RequestOutput:
        device = self.config.model.device
        cfg = self.model_config
        kv = ContiguousKVCache.for_config(cfg.text, self.config.model.torch_dtype, device)
        sampler = Sampler(params, (cfg.tokens.im_end,), prompt.token_ids, device)
        detok = self.tokenizer.detokenizer()
        ids = torch.tensor(prompt.token_ids, device=device)
        logits = self.thinker(ids, prompt.rope.positions.to(device), kv, media).logits[-1]
        picks: list[TokenLogprob] = []
        while True:
            picks.append(sampler(logits))
            token = picks[-1].token_id
            if sampler.is_stop_token(token):
                return self._output(prompt, picks, detok.text + detok.flush(), "stop", params)
            detok.add([token])
            cut = _find_stop(detok.text, params.stop)
            if cut is not None:
                return self._output(prompt, picks, detok.text[:cut], "stop", params)
            if len(picks) == max_tokens:
                return self._output(prompt, picks, detok.text + detok.flush(), "length", params)
            index = prompt.num_prompt_tokens + len(picks) - 1
            positions = prompt.rope.decode(index).to(device)
            logits = self.thinker(torch.tensor([token], device=device), positions, kv).logits[-1]

    @staticmethod
    def _output(prompt: Prompt, picks: list[TokenLogprob], text: str, reason: str, params) -> RequestOutput:
        return RequestOutput(
            prompt.token_ids, [p.token_id for p in picks], text, reason, picks if params.logprobs else None
        )


def _find_stop(text: str, stops: tuple[str, ...]) -> int | None:
    """Index where the earliest stop string begins in ``text``, or None."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None
