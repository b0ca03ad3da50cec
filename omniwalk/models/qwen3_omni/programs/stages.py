"""Qwen3-Omni as a graph for the walk runtime: its stages, and each request's walk through them.

    audio_encoder ─┐
                   ├─► thinker ─(tokens, streaming)─► talker ─(frames, streaming)─► vocoder
    vision_encoder ┘

A request visits the encoders its media need, always the thinker, and the talker and vocoder
only when it asks for audio (t2t, s2t, i2t, v2t, t2s, s2s, i2s, v2s and any mix). The engine
sees only stage kinds (batch stages, KV stages) and these programs; nothing else of the model.
"""

from __future__ import annotations

from omniwalk.config import EngineConfig, ModelConfig
from omniwalk.engine.batch_stage import BatchStage, BatchStageConfig
from omniwalk.engine.kv_pages import KVStorage
from omniwalk.engine.kv_stage import KVStage, KVStageConfig
from omniwalk.engine.prefill_graphs import PrefillPlan
from omniwalk.models.qwen3_omni.checkpoint.config import DecoderConfig, Qwen3OmniConfig
from omniwalk.models.qwen3_omni.networks.code2wav_stream import VocoderStreamConfig
from omniwalk.models.qwen3_omni.networks.talker import TalkerSamplingParams
from omniwalk.models.qwen3_omni.processing.chat import Prompt
from omniwalk.models.qwen3_omni.processing.talker_prompt import talker_prefix_length
from omniwalk.models.qwen3_omni.programs.encoder_programs import AudioEncoderProgram, VisionEncoderProgram
from omniwalk.models.qwen3_omni.programs.request_state import (
    AUDIO,
    MediaState,
    OmniRequestState,
    TalkerState,
    ThinkerState,
    VocoderState,
)
from omniwalk.models.qwen3_omni.programs.talker_program import TalkerProgram
from omniwalk.models.qwen3_omni.programs.thinker_program import ThinkerProgram
from omniwalk.models.qwen3_omni.programs.vocoder_program import VocoderProgram
from omniwalk.sampling import SamplerState, SamplingParams
from omniwalk.tokenizer import IncrementalDetokenizer

STAGES = ("audio_encoder", "vision_encoder", "thinker", "talker", "vocoder")


def _kv_storage(cfg: DecoderConfig, budget: int, page_size: int, dtype, device) -> KVStorage:
    return KVStorage.from_budget(
        budget, page_size, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, dtype, device
    )


def build_stages(parts: dict, cfg: Qwen3OmniConfig, engine: EngineConfig, model: ModelConfig) -> list:
    """The engine stages over loaded components (``model.load_components`` names); talker and
    vocoder stages exist only when those components were loaded. CUDA graphs are captured
    by ``Engine.capture_graphs`` once the stages exist."""
    dtype, device = model.torch_dtype, model.device
    engine = engine.sized_for(model)  # (OmniConfig did it already; a config built by hand may not have)
    decode, prefill = model.backend("decode_attention"), model.backend("attention_backend")
    graphs = min(model.graph_max_batch, engine.max_running)  # no decode batch is larger than max_running
    encoder_batch = BatchStageConfig(engine.encoder_batch_units, engine.max_running)
    encoder_graphs = model.graph_max_encoder_tokens
    audio = AudioEncoderProgram(parts["audio_encoder"], device, dtype, encoder_graphs)
    vision = VisionEncoderProgram(parts["vision_encoder"], device, dtype, encoder_graphs)
    stages = [
        BatchStage("audio_encoder", audio, encoder_batch, device),
        BatchStage("vision_encoder", vision, encoder_batch, device),
        KVStage(
            "thinker",
            ThinkerProgram(
                parts["thinker"],
                device,
                decode,
                graphs,
                PrefillPlan(min(model.graph_max_prefill_tokens, engine.max_batch_tokens), prefill),
                len(cfg.vision.deepstack_visual_indexes),
            ),
            _kv_storage(cfg.text, engine.thinker_kv_bytes, engine.page_size, dtype, device),
            KVStageConfig(engine.max_batch_tokens, engine.max_running, decode, prefill),
            device,
        ),
    ]
    if "talker" in parts:
        plan = PrefillPlan(min(model.graph_max_prefill_tokens, engine.talker_max_batch_tokens), prefill)
        talker = TalkerProgram(
            parts["talker"], parts["thinker"], cfg.position_id_per_seconds, device, decode, graphs, plan
        )
        storage = _kv_storage(cfg.talker.text, engine.talker_kv_bytes, engine.page_size, dtype, device)
        stream = VocoderStreamConfig(engine.vocoder_chunk_frames, engine.vocoder_first_chunk_frames)
        stages += [
            KVStage(
                "talker",
                talker,
                storage,
                KVStageConfig(engine.talker_max_batch_tokens, engine.max_running, decode, prefill),
                device,
            ),
            BatchStage(
                "vocoder",
                VocoderProgram(parts["code2wav"], stream, device, engine.max_running, engine.vocoder_max_batch, graphs),
                BatchStageConfig(2**31, engine.max_running),
                device,
            ),
        ]
    return stages


def new_state(
    prompt: Prompt,
    params: SamplingParams,
    max_tokens: int,
    detok: IncrementalDetokenizer,
    cfg: Qwen3OmniConfig,
    *,
    use_audio_in_video: bool = False,
    speech: TalkerSamplingParams | None = None,
    speaker: int | None = None,
    device="cpu",
) -> tuple[tuple[str, ...], OmniRequestState]:
    """A processed request -> (its walk, its state)."""
    items = prompt.items
    waves = [i.data["audio"] for i in items if i.kind == AUDIO or (use_audio_in_video and i.num_audio_tokens)]
    vision = [i for i in items if i.kind != AUDIO]
    thinker = ThinkerState(
        prompt,
        params,
        SamplerState(params, (cfg.tokens.im_end,), prompt.token_ids),
        detok,
        max_tokens,
        list(prompt.token_ids),
    )
    state = OmniRequestState(MediaState(waves, vision), thinker, use_audio_in_video=use_audio_in_video)
    walk = (("audio_encoder",) if waves else ()) + (("vision_encoder",) if vision else ()) + ("thinker",)
    if speech is not None:
        state.talker = TalkerState(
            speech,
            speaker,
            SamplerState(speech.talker(), (cfg.talker.codec.eos,), []),
            SamplerState(speech.code_predictor(), (), []),
            talker_prefix_length(prompt.token_ids, cfg.tokens),
        )
        state.vocoder = VocoderState()
        walk += ("talker", "vocoder")
    return walk, state
