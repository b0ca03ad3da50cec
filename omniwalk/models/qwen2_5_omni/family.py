"""Qwen2.5-Omni in the family socket (``models/family.py``): its checkpoint, stages, requests, outputs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from omniwalk.config import OmniConfig
from omniwalk.engine.request import EngineRequest
from omniwalk.errors import CheckpointError, ConfigError, InvalidRequestError
from omniwalk.models.common.checkpoint.loader import Backends
from omniwalk.models.common.processing.chat import Prompt
from omniwalk.models.family import ModelFamily, ModelInfo, RequestOutput
from omniwalk.models.qwen2_5_omni.checkpoint.config import Qwen25OmniConfig
from omniwalk.models.qwen2_5_omni.checkpoint.loader import components, load_components, num_parameters
from omniwalk.models.qwen2_5_omni.checkpoint.tiny import make_tiny_checkpoint
from omniwalk.models.qwen2_5_omni.processing.chat import DEFAULT_SYSTEM_PROMPT, ChatProcessor
from omniwalk.models.qwen2_5_omni.processing.media_inputs import measure
from omniwalk.models.qwen2_5_omni.programs.stages import build_stages, new_state
from omniwalk.sampling import SamplingParams
from omniwalk.tokenizer import Tokenizer

SPEAKERS_FILE = "spk_dict.pt"
PROMPT_FIELDS = {"use_audio_in_video": "flag", "use_default_system_prompt": "flag"}
# speech sampling: request field -> (SamplingParams field of the talker's draws, default: HF's generate)
SPEECH_FIELDS = {
    "talker_temperature": ("temperature", 0.9), "talker_top_k": ("top_k", 40), "talker_top_p": ("top_p", 0.8),
    "talker_repetition_penalty": ("repetition_penalty", 1.05), "max_audio_frames": ("max_tokens", 4096),
    "min_audio_frames": ("min_tokens", 0),
}  # fmt: skip


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
        system = DEFAULT_SYSTEM_PROMPT if mc.default_system_prompt is None else mc.default_system_prompt
        self.processor = ChatProcessor(cfg, self.tokenizer, system)
        self.speakers = read_speakers(mc.model) if cfg.enable_audio_output else {}
        self.parts = load_components(
            mc.model,
            components(cfg),
            cfg,
            dtype=mc.torch_dtype,
            device=mc.device,
            backends=Backends(mc.attention_backend, mc.moe_backend, mc.norm_backend),
            random_seed=0 if mc.random_weights else None,
        )
        self.max_model_len = mc.max_model_len or cfg.text.max_position_embeddings
        # TODO: "audio" out, the speech fields and the sample rate once token2wav joins the walk (the talker
        # stage runs already: codec ids, ``output().codes``)
        voices = tuple(sorted(self.speakers))
        self.info = ModelInfo(
            name="qwen2.5-omni", output_modalities=("text",), voices=voices, request_fields=PROMPT_FIELDS
        )

    def build_stages(self) -> list:
        return build_stages(self.parts, self.cfg, self.config)

    def prompt(self, request: dict) -> Prompt:
        """Request -> thinker prompt: ids, media spans, measured media items, TMRoPE positions."""
        if "messages" not in request:
            raise InvalidRequestError("a request is a dict with 'messages'")
        ids, parts = self.processor.tokenize(request["messages"], bool(request.get("use_default_system_prompt", True)))
        items = [measure(part, self.config.media) for part in parts]
        return self.processor.build(ids, items, bool(request.get("use_audio_in_video", False)))

    def new_request(self, request: dict):
        if request.get("forced_answer") is not None:
            raise InvalidRequestError("forced_answer (speech of a given text) needs audio output, not served yet")
        params = SamplingParams.from_request(request)
        prompt = self.prompt(request)
        room = self.max_model_len - prompt.num_prompt_tokens
        if room < 1:
            raise InvalidRequestError(
                f"the prompt has {prompt.num_prompt_tokens} tokens; the context length is {self.max_model_len}"
            )
        aiv = bool(request.get("use_audio_in_video", False))
        speech, bos = self._speech(request) if "audio" in (request.get("modalities") or ()) else (None, 0)
        detok = self.tokenizer.detokenizer()
        max_tokens = min(params.max_tokens, room)
        return new_state(
            prompt, params, max_tokens, detok, self.cfg, use_audio_in_video=aiv, speech=speech, speaker_bos=bos
        )

    def _speech(self, request: dict) -> tuple[SamplingParams, int]:
        """The talker's sampling parameters and the speaker's text bos (voices match case-insensitively)."""
        if not self.speakers:
            raise InvalidRequestError("this model has no audio output")
        voice = str(request.get("voice") or next(iter(self.speakers))).lower()
        if voice not in self.speakers:
            raise InvalidRequestError(f"unknown voice {request.get('voice')!r}; voices: {sorted(self.speakers)}")
        given = {f: request[key] for key, (f, _) in SPEECH_FIELDS.items() if request.get(key) is not None}
        defaults = {f: default for f, default in SPEECH_FIELDS.values()}
        speech = SamplingParams(**{**defaults, **given, "seed": request.get("seed")})
        return speech, int(self.speakers[voice]["bos_token"])

    def output(self, req: EngineRequest) -> Qwen25OmniOutput:
        th, talker = req.state.thinker, req.state.talker
        picks = th.picks if th.params.logprobs else None
        out = Qwen25OmniOutput(req.id, th.prompt.token_ids, th.generated, th.text, th.finish_reason, picks)
        out.codes = list(talker.codes) if talker is not None else None
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
        return "\n".join([
            f"thinker:  {cfg.text}",
            f"audio:    {cfg.audio}",
            f"vision:   {cfg.vision}",
            f"talker:   {cfg.talker.text if cfg.talker else None}",
            f"parameters (thinker, encoders, talker): {num_parameters(cfg):,}",
        ])  # fmt: skip
