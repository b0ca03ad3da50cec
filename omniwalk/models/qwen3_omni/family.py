"""Qwen3-Omni in the family socket (``models/family.py``): its checkpoint, stages, requests, outputs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from omniwalk.config import OmniConfig
from omniwalk.engine.request import EngineRequest
from omniwalk.errors import InvalidRequestError
from omniwalk.layers.moe import use_routing
from omniwalk.media.patches import IMAGE_PATCHES, VIDEO_PATCHES
from omniwalk.models.common.checkpoint.loader import Backends
from omniwalk.models.common.processing.chat import ChatProcessor, Prompt, measure_parts
from omniwalk.models.common.programs.adapters import name_adapter, thinker_adapters
from omniwalk.models.common.programs.request_state import constrain, grammars_for, prompt_tools
from omniwalk.models.family import ModelFamily, ModelInfo, RequestOutput
from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig
from omniwalk.models.qwen3_omni.checkpoint.loader import (
    checkpoint_layout,
    load_components,
    num_parameters,
    weights_summary,
)
from omniwalk.models.qwen3_omni.checkpoint.tiny import make_tiny_checkpoint
from omniwalk.models.qwen3_omni.networks.talker import TalkerSamplingParams
from omniwalk.models.qwen3_omni.processing.media_inputs import measure
from omniwalk.models.qwen3_omni.processing.talker_prompt import resolve_speaker
from omniwalk.models.qwen3_omni.programs.stages import STAGES, build_stages, new_state
from omniwalk.parallel import ranks
from omniwalk.parallel.layers import shard_decoder
from omniwalk.parallel.placement import check_devices_exist, check_stages, parse_placement
from omniwalk.sampling import SamplingParams
from omniwalk.tokenizer import Tokenizer

SAMPLE_RATE = 24000  # Code2Wav's output, Hz
# the system turn of a request without one (as HF's Qwen3-Omni examples give it; a config field overrides it)
DEFAULT_SYSTEM_PROMPT = (
    "You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of perceiving auditory and "
    "visual inputs, as well as generating text and speech."
)
# speech sampling (``TalkerSamplingParams``) and prompt options; kinds as in serve/schemas.py
SPEECH_FIELDS = {
    "talker_temperature": "temperature",
    "talker_top_k": "top_k",
    "talker_top_p": "top_p",
    "talker_repetition_penalty": "penalty",
    "code_predictor_temperature": "temperature",
    "code_predictor_top_k": "top_k",
    "code_predictor_top_p": "top_p",
    "min_audio_frames": "count0",
    "max_audio_frames": "count",
}
PROMPT_FIELDS = {"use_audio_in_video": "flag", "use_default_system_prompt": "flag"}
PATCH_SPECS = {"image": IMAGE_PATCHES, "video": VIDEO_PATCHES}  # its processor's resizing (the media defaults)
COMPONENTS = {
    "audio_encoder": "audio_encoder",
    "vision_encoder": "vision_encoder",
    "thinker": "thinker",
    "talker": "talker",
    "vocoder": "code2wav",
}  # stage -> its checkpoint component


@dataclass
class Qwen3OmniOutput(RequestOutput):
    codes: torch.Tensor | None = None  # int64 [frames, code groups], complete frames only (audio out)


class Qwen3OmniFamily(ModelFamily):
    def __init__(self, config: OmniConfig):
        self.config, mc = config, config.model
        self.cfg = cfg = Qwen3OmniConfig.from_hf(mc.model)
        self.tokenizer = Tokenizer.from_dir(mc.model)
        self.grammars = grammars_for(config, mc.model, cfg.text.vocab_size, (cfg.tokens.im_end,))
        system = DEFAULT_SYSTEM_PROMPT if mc.default_system_prompt is None else mc.default_system_prompt
        self.processor = ChatProcessor(cfg, self.tokenizer, system)
        speaks = cfg.enable_audio_output
        self.rank, self.world = ranks.rank_of(mc.tensor_parallel), mc.tensor_parallel
        # tensor-parallel ranks > 0 follow rank 0's thinker only (``parallel/lockstep.py``): no talker, no vocoder
        self.stages = STAGES if speaks and self.rank == 0 else STAGES[:3]
        placed = parse_placement(mc.placement, mc.device)
        check_stages(placed, STAGES if speaks else STAGES[:3])
        self.devices = {stage: placed.get(stage, mc.device) for stage in self.stages}
        check_devices_exist(self.devices.values())
        self.text_embedding = None  # the thinker's input embedding table on the talker's device
        self.parts = load_components(
            mc.model,
            tuple(COMPONENTS[stage] for stage in self.stages),
            dtype=mc.torch_dtype,
            device={COMPONENTS[stage]: device for stage, device in self.devices.items()},
            backends=Backends(mc.attention_backend, mc.moe_backend, mc.decoder_kernels, mc.persistent_decode),
            cfg=cfg,
            random_seed=0 if mc.random_weights else None,
            quantization=mc.quantization,
            transform=self._place_thinker,
        )
        # (a benchmark's balanced routing; MoE layers numbered thinker first, then talker)
        routed = nn.ModuleList(self.parts[n] for n in ("thinker", "talker") if n in self.parts)
        use_routing(routed, mc.moe_routing, mc.moe_routing_seed)
        if "talker" in self.stages:
            shared = self.text_embedding is None
            self.parts["text_embedding"] = self.parts["thinker"].model.embed_tokens if shared else self.text_embedding
        self.max_model_len = mc.max_model_len or cfg.text.max_position_embeddings
        self.adapters = thinker_adapters(cfg.text, config, self.devices["thinker"])  # (LoRA; None without slots)
        self.info = ModelInfo(
            name="qwen3-omni",
            output_modalities=("text", "audio") if speaks else ("text",),
            voices=tuple(name for name, _ in cfg.talker.speakers) if speaks else (),
            sample_rate=SAMPLE_RATE if speaks else 0,
            request_fields={**(SPEECH_FIELDS if speaks else {}), **PROMPT_FIELDS},
            speech_fields=tuple(SPEECH_FIELDS) if speaks else (),
            weights=weights_summary(self.parts, mc.quantization),
            patch_specs=PATCH_SPECS,
        )

    def _place_thinker(self, component: str, module) -> None:
        """After the thinker's weights are loaded: the talker's copy of its input embeddings (when the
        talker runs elsewhere, or the thinker's table is split over ranks), then its shard of a
        tensor-parallel thinker."""
        if component != "thinker":
            return
        if "talker" in self.stages and (self.devices["talker"] != self.devices["thinker"] or self.world > 1):
            table = module.model.embed_tokens.weight.detach().to(self.devices["talker"])
            self.text_embedding = torch.nn.Embedding.from_pretrained(table, freeze=True)
        if self.world > 1:
            shard_decoder(module, self.rank, self.world)

    def build_stages(self) -> list:
        return build_stages(self.parts, self.cfg, self.config, self.devices, self.adapters)

    def prompt(self, request: dict) -> Prompt:
        """Request -> thinker prompt: ids, media spans, measured media items, MRoPE positions."""
        if "messages" not in request:
            raise InvalidRequestError("a request is a dict with 'messages'")
        tools = prompt_tools(request, self.processor)
        ids, parts = self.processor.tokenize(
            request["messages"], bool(request.get("use_default_system_prompt", True)), **tools
        )
        items = measure_parts(parts, lambda part: measure(part, self.cfg.audio.n_window, self.config.media))
        return self.processor.build(ids, items, bool(request.get("use_audio_in_video", False)))

    def new_request(self, request: dict):
        speak = "audio" in (request.get("modalities") or ()) and "talker" in self.stages
        params = SamplingParams.from_request(request)
        speech = TalkerSamplingParams.from_request(request) if speak else None
        speaker = resolve_speaker(self.cfg.talker.speaker_ids, request.get("voice")) if speak else None
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
            self.cfg,
            use_audio_in_video=bool(request.get("use_audio_in_video", False)),
            speech=speech,
            speaker=speaker,
        )
        state.thinker.forced_answer = answer
        constrain(state.thinker, request, self.grammars, self.tokenizer)
        state.thinker.speaks = "audio" in (request.get("modalities") or ())  # (on every rank alike)
        name_adapter(state.thinker, self.adapters, request)
        return walk, state

    def _forced_answer(self, text) -> list[int] | None:
        """``forced_answer`` (text the thinker answers with instead of generating, e.g. speech of a
        given text) -> its token ids + the end of the turn."""
        if text is None:
            return None
        if not isinstance(text, str) or not text:
            raise InvalidRequestError("forced_answer must be a non-empty string")
        return self.tokenizer.encode(text) + [self.cfg.tokens.im_end]

    def output(self, req: EngineRequest) -> Qwen3OmniOutput:
        st, th = req.state, req.state.thinker
        out = Qwen3OmniOutput(
            req.id,
            th.prompt.token_ids,
            th.generated,
            th.text,
            th.finish_reason,
            th.picks if th.params.logprobs else None,
        )
        out.num_cached_tokens = req.cached.get("thinker", 0)
        out.num_audio_prompt_tokens = th.prompt.token_ids.count(self.cfg.tokens.audio_pad)
        if st.talker is not None:
            frames = st.talker.frames
            groups = self.cfg.talker.num_code_groups
            out.codes = torch.stack(frames) if frames else torch.zeros(0, groups, dtype=torch.long)
            out.audio = torch.cat(st.vocoder.chunks) if st.vocoder.chunks else torch.zeros(0)
        return out

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    @classmethod
    def make_tiny(cls, out_dir: Path, config=None, seed: int = 0, **options) -> Path:
        return make_tiny_checkpoint(out_dir, config, seed, **options)

    @classmethod
    def describe(cls, path) -> str:
        cfg = Qwen3OmniConfig.from_hf(path)
        return "\n".join(
            [
                f"thinker:  {cfg.text}",
                f"audio:    {cfg.audio}",
                f"vision:   {cfg.vision}",
                f"talker:   {cfg.talker.text}",
                f"code predictor: {cfg.talker.code_predictor}",
                f"code2wav: {cfg.code2wav}",
                f"voices:   {', '.join(name for name, _ in cfg.talker.speakers)}",
                f"tensors:  {len(checkpoint_layout(cfg)):,}   parameters: {num_parameters(cfg):,}",
            ]
        )
