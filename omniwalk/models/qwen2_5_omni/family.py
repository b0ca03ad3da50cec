"""Qwen2.5-Omni in the family socket (``models/family.py``): its checkpoint, stages, requests, outputs."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

import torch

from omniwalk.config import OmniConfig
from omniwalk.engine.request import EngineRequest
from omniwalk.errors import CheckpointError, ConfigError, InvalidRequestError
from omniwalk.models.common.checkpoint.loader import Backends
from omniwalk.models.common.processing.chat import Prompt, measure_parts
from omniwalk.models.common.programs.adapters import name_adapter, thinker_adapters
from omniwalk.models.common.programs.request_state import constrain, grammars_for, prompt_tools
from omniwalk.models.family import ModelFamily, ModelInfo, RequestOutput
from omniwalk.models.qwen2_5_omni.checkpoint.config import Qwen25OmniConfig
from omniwalk.models.qwen2_5_omni.checkpoint.loader import components, load_components, num_parameters
from omniwalk.models.qwen2_5_omni.checkpoint.tiny import make_tiny_checkpoint
from omniwalk.models.qwen2_5_omni.networks.token2wav import SAMPLE_RATE
from omniwalk.models.qwen2_5_omni.processing.chat import DEFAULT_SYSTEM_PROMPT, ChatProcessor
from omniwalk.models.qwen2_5_omni.processing.media_inputs import PATCH_SPECS, measure
from omniwalk.models.qwen2_5_omni.programs.stages import build_stages, new_state
from omniwalk.models.qwen2_5_omni.programs.token2wav_program import Token2WavState
from omniwalk.sampling import SamplingParams
from omniwalk.tokenizer import Tokenizer

SPEAKERS_FILE = "spk_dict.pt"
PROMPT_FIELDS = {"use_audio_in_video": "flag", "use_default_system_prompt": "flag"}
# speech sampling: request field -> (SamplingParams field of the talker's draws, default: HF's generate)
SPEECH_FIELDS = {
    "talker_temperature": ("temperature", 0.9),
    "talker_top_k": ("top_k", 40),
    "talker_top_p": ("top_p", 0.8),
    "talker_repetition_penalty": ("repetition_penalty", 1.05),
    "max_audio_frames": ("max_tokens", 4096),
    "min_audio_frames": ("min_tokens", 0),
}
# request fields of audio out -> their kinds (serve/schemas.py FIELD_KINDS); ``seed`` also seeds token2wav's noise
AUDIO_FIELDS = {
    "talker_temperature": "temperature",
    "talker_top_k": "top_k",
    "talker_top_p": "top_p",
    "talker_repetition_penalty": "penalty",
    "max_audio_frames": "count",
    "min_audio_frames": "count0",
    "token2wav_num_steps": "count",
}
MAX_TOKEN2WAV_STEPS = 64  # ODE time points a request may ask for (the checkpoint's default: 10)


@dataclass
class Qwen25OmniOutput(RequestOutput):
    codes: list[int] | None = None  # the talker's codec ids (speech), the stop code excluded


def read_speakers(ckpt_dir: str | Path) -> dict[str, dict]:
    """``spk_dict.pt``: lower-case speaker name -> {bos_token, cond, ref_mel} (tensors on the CPU)."""
    path = Path(ckpt_dir) / SPEAKERS_FILE
    if not path.exists():
        raise CheckpointError(f"{ckpt_dir}: no {SPEAKERS_FILE} (the speakers of a checkpoint with audio output)")
    try:
        speakers = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # (a truncated or foreign file: torch raises many kinds)
        raise CheckpointError(f"{path}: unreadable speaker file: {e}") from None
    out = {}
    for name, entry in speakers.items():
        if not isinstance(entry, dict) or not {"bos_token", "cond", "ref_mel"} <= set(entry):
            raise CheckpointError(f"{path}: speaker {name!r} needs bos_token, cond and ref_mel")
        out[str(name).lower()] = entry
    return out


class Qwen25OmniFamily(ModelFamily):
    def __init__(self, config: OmniConfig):
        self.config, mc = config, config.model
        unsupported = {"quantization": "none", "placement": "", "tensor_parallel": 1}
        for name, default in unsupported.items():
            if getattr(mc, name) != default:
                raise ConfigError(f"{name}={getattr(mc, name)!r} is not supported for Qwen2.5-Omni yet")
        self.cfg = cfg = Qwen25OmniConfig.from_hf(mc.model)
        self.tokenizer = Tokenizer.from_dir(mc.model)
        self.grammars = grammars_for(config, mc.model, cfg.text.vocab_size, (cfg.tokens.im_end,))
        system = DEFAULT_SYSTEM_PROMPT if mc.default_system_prompt is None else mc.default_system_prompt
        self.processor = ChatProcessor(cfg, self.tokenizer, system)
        self.speakers = read_speakers(mc.model) if cfg.enable_audio_output else {}
        self.parts = load_components(
            mc.model,
            components(cfg),
            cfg,
            dtype=mc.torch_dtype,
            device=mc.device,
            backends=Backends(mc.attention_backend, mc.moe_backend, mc.decoder_kernels, mc.persistent_decode),
            random_seed=0 if mc.random_weights else None,
        )
        self.max_model_len = mc.max_model_len or cfg.text.max_position_embeddings
        self.adapters = thinker_adapters(cfg.text, config, mc.device)  # (LoRA; None without slots)
        speaks = cfg.enable_audio_output
        self.info = ModelInfo(
            name="qwen2.5-omni",
            output_modalities=("text", "audio") if speaks else ("text",),
            voices=tuple(sorted(self.speakers)),
            sample_rate=SAMPLE_RATE if speaks else 0,
            request_fields={**(AUDIO_FIELDS if speaks else {}), **PROMPT_FIELDS},
            speech_fields=tuple(AUDIO_FIELDS) if speaks else (),
            patch_specs=PATCH_SPECS,
        )

    def build_stages(self) -> list:
        return build_stages(self.parts, self.cfg, self.config, self.speakers, self.adapters)

    def prompt(self, request: dict) -> Prompt:
        """Request -> thinker prompt: ids, media spans, measured media items, TMRoPE positions."""
        if "messages" not in request:
            raise InvalidRequestError("a request is a dict with 'messages'")
        tools = prompt_tools(request, self.processor)
        ids, parts = self.processor.tokenize(
            request["messages"], bool(request.get("use_default_system_prompt", True)), **tools
        )
        items = measure_parts(parts, lambda part: measure(part, self.config.media))
        return self.processor.build(ids, items, bool(request.get("use_audio_in_video", False)))

    def new_request(self, request: dict):
        params = SamplingParams.from_request(request)
        speaks = "audio" in (request.get("modalities") or ())
        speech, bos, token2wav = self._speech(request) if speaks else (None, 0, None)
        prompt = self.prompt(request)
        room = self.max_model_len - prompt.num_prompt_tokens
        answer = self._forced_answer(request.get("forced_answer"), speaks)
        if room < max(1, len(answer or ())):
            raise InvalidRequestError(
                f"the prompt has {prompt.num_prompt_tokens} tokens; the context length is {self.max_model_len}"
            )
        aiv = bool(request.get("use_audio_in_video", False))
        detok = self.tokenizer.detokenizer()
        max_tokens = len(answer) if answer else min(params.max_tokens, room)
        walk, state = new_state(
            prompt,
            params,
            max_tokens,
            detok,
            self.cfg,
            use_audio_in_video=aiv,
            speech=speech,
            speaker_bos=bos,
            token2wav=token2wav,
        )
        state.thinker.forced_answer = answer
        constrain(state.thinker, request, self.grammars, self.tokenizer)
        state.thinker.speaks = "audio" in (request.get("modalities") or ())  # (on every rank alike)
        name_adapter(state.thinker, self.adapters, request)
        return walk, state

    def _speech(self, request: dict) -> tuple[SamplingParams, int, Token2WavState]:
        """The talker's sampling parameters, the speaker's text bos and token2wav's inputs (voices
        match case-insensitively; without a ``seed`` the noise has a random one)."""
        if not self.speakers:
            raise InvalidRequestError("this model has no audio output")
        voice = str(request.get("voice") or next(iter(self.speakers))).lower()
        if voice not in self.speakers:
            raise InvalidRequestError(f"unknown voice {request.get('voice')!r}; voices: {sorted(self.speakers)}")
        given = {f: request[key] for key, (f, _) in SPEECH_FIELDS.items() if request.get(key) is not None}
        defaults = {f: default for f, default in SPEECH_FIELDS.values()}
        speech = SamplingParams(**{**defaults, **given, "seed": request.get("seed")})
        steps = request.get("token2wav_num_steps")
        if steps is not None and (type(steps) is not int or not 2 <= steps <= MAX_TOKEN2WAV_STEPS):
            raise InvalidRequestError(
                f"token2wav_num_steps must be an integer in [2, {MAX_TOKEN2WAV_STEPS}]: {steps!r}"
            )
        seed = request.get("seed")
        seed = secrets.randbits(63) if seed is None else seed
        token2wav = Token2WavState(voice, seed, steps, one_shot=not request.get("stream", False))
        return speech, int(self.speakers[voice]["bos_token"]), token2wav

    def _forced_answer(self, text, speaks: bool) -> list[int] | None:
        """``forced_answer`` (a text to speak instead of a generated answer: ``/v1/audio/speech``) ->
        its token ids + the end of the turn."""
        if text is None:
            return None
        if not speaks:
            raise InvalidRequestError("forced_answer (speech of a given text) needs 'audio' in modalities")
        if not isinstance(text, str) or not text:
            raise InvalidRequestError("forced_answer must be a non-empty string")
        return self.tokenizer.encode(text) + [self.cfg.tokens.im_end]

    def output(self, req: EngineRequest) -> Qwen25OmniOutput:
        th, talker = req.state.thinker, req.state.talker
        picks = th.picks if th.params.logprobs else None
        out = Qwen25OmniOutput(req.id, th.prompt.token_ids, th.generated, th.text, th.finish_reason, picks)
        out.num_cached_tokens = req.cached.get("thinker", 0)
        out.num_audio_prompt_tokens = th.prompt.token_ids.count(self.cfg.tokens.audio_pad)
        if talker is not None:
            chunks = talker.token2wav.chunks
            out.codes = list(talker.codes)
            out.audio = torch.cat(chunks) if chunks else torch.zeros(0)
        return out

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    @classmethod
    def make_tiny(cls, out_dir: Path, config=None, seed: int = 0, quantization: str = "none", **options) -> Path:
        if quantization != "none":
            raise ConfigError(f"Qwen2.5-Omni checkpoints have no {quantization!r} format here; make it without one")
        return make_tiny_checkpoint(out_dir, config, seed, **options)

    @classmethod
    def describe(cls, path) -> str:
        cfg = Qwen25OmniConfig.from_hf(path)
        return "\n".join(
            [
                f"thinker:  {cfg.text}",
                f"audio:    {cfg.audio}",
                f"vision:   {cfg.vision}",
                f"talker:   {cfg.talker.text if cfg.talker else None}",
                f"token2wav: {cfg.token2wav}",
                f"voices:   {', '.join(sorted(read_speakers(path))) if (Path(path) / SPEAKERS_FILE).exists() else '-'}",
                f"parameters (thinker, encoders, talker, token2wav): {num_parameters(cfg):,}",
            ]
        )
