"""Qwen3-Omni as a graph for the walk runtime: its stages, and each request's walk through them.

    audio_encoder ─┐
                   ├─► thinker ─(tokens, streaming)─► talker ─(frames, streaming)─► vocoder
    vision_encoder ┘

A request visits the encoders its media need, always the thinker, and the talker and vocoder
only when it asks for audio (t2t, s2t, i2t, v2t, t2s, s2s, i2s, v2s and any mix). The engine
sees only stage kinds (batch stages, KV stages) and these programs; nothing else of the model.
"""

from __future__ import annotations

from omniwalk.config import EngineConfig, OmniConfig
from omniwalk.engine.batch_stage import BatchStage, BatchStageConfig
from omniwalk.engine.kv_stage import KVStage, KVStageConfig
from omniwalk.engine.prefill_graphs import PrefillPlan
from omniwalk.models.common.processing.chat import Prompt
from omniwalk.models.common.processing.positions import AUDIO
from omniwalk.models.common.programs.encoder_programs import AudioEncoderProgram
from omniwalk.models.common.programs.request_state import MediaState, OmniRequestState, ThinkerState
from omniwalk.models.common.programs.thinker_program import ThinkerProgram, kv_storage
from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig
from omniwalk.models.qwen3_omni.networks.code2wav_stream import VocoderStreamConfig
from omniwalk.models.qwen3_omni.networks.talker import TalkerSamplingParams
from omniwalk.models.qwen3_omni.options import Qwen3OmniOptions
from omniwalk.models.qwen3_omni.processing.talker_prompt import talker_prefix_length
from omniwalk.models.qwen3_omni.programs.encoder_programs import VisionEncoderProgram
from omniwalk.models.qwen3_omni.programs.request_state import TalkerState, VocoderState
from omniwalk.models.qwen3_omni.programs.talker_program import TalkerProgram
from omniwalk.models.qwen3_omni.programs.vocoder_program import VocoderProgram
from omniwalk.parallel.layers import local_heads
from omniwalk.sampling import SamplerState, SamplingParams
from omniwalk.tokenizer import IncrementalDetokenizer

STAGES = ("audio_encoder", "vision_encoder", "thinker", "talker", "vocoder")


def build_stages(parts: dict, cfg: Qwen3OmniConfig, config: OmniConfig, devices: dict[str, str], adapters=None) -> list:
    """The engine stages over loaded components (``checkpoint/loader.py`` names) for a resolved
    config (``config.resolve_auto``), each on its device (``devices``: stage -> device); talker and
    vocoder stages exist only when those components were loaded (and ``parts["text_embedding"]``,
    the thinker's input embeddings on the talker's device). A tensor-parallel thinker keeps its
    rank's share of the KV heads; ``adapters``: the thinker's LoRA adapters (``ThinkerAdapters``) or None.
    CUDA graphs are captured by ``Engine.capture_graphs`` once the stages exist."""
    model, engine, opts = config.model, config.engine, config.family or Qwen3OmniOptions()
    dtype = model.torch_dtype
    decode, prefill = model.decode_attention, model.attention_backend
    graphs = min(engine.cuda_graph_max_batch, engine.max_running)  # no decode batch is larger than max_running
    audio_batch = BatchStageConfig(opts.audio_encoder_batch_units, engine.max_running)
    vision_batch = BatchStageConfig(opts.vision_encoder_batch_units, engine.max_running)
    encoder_graphs = engine.encoder_graph_max_tokens
    audio = AudioEncoderProgram(
        parts["audio_encoder"], devices["audio_encoder"], dtype, graph_max_tokens=encoder_graphs
    )
    vision = VisionEncoderProgram(parts["vision_encoder"], devices["vision_encoder"], dtype, encoder_graphs)
    plan, deepstack = _prefill(engine, engine.max_batch_tokens, prefill), len(cfg.vision.deepstack_visual_indexes)
    device, page = devices["thinker"], engine.page_size
    # A model that speaks keeps its prompt rows beside their keys (2 x hidden a slot, ~8% of the thinker's KV
    # bytes at full size), so speaking requests take prefix pages too (a voice conversation's history); decided
    # by the config, not by this rank's parts, so every tensor-parallel rank keys alike.
    rows = 2 * cfg.text.hidden_size if cfg.enable_audio_output else 0
    thinker = ThinkerProgram(parts["thinker"], device, decode, graphs, plan, deepstack, adapters, bool(rows))
    text = local_heads(cfg.text, model.tensor_parallel)
    stages = [
        BatchStage("audio_encoder", audio, audio_batch, devices["audio_encoder"]),
        BatchStage("vision_encoder", vision, vision_batch, devices["vision_encoder"]),
        KVStage(
            "thinker",
            thinker,
            kv_storage(text, opts.thinker_kv_bytes, page, dtype, device, rows),
            KVStageConfig(engine.max_batch_tokens, engine.max_running, decode, prefill, engine.prefix_cache),
            device,
        ),
    ]
    if "talker" in parts:
        budget = opts.talker_max_batch_tokens or engine.max_batch_tokens
        device, voice = devices["talker"], devices["vocoder"]
        talker = TalkerProgram(
            parts["talker"],
            parts["text_embedding"],
            cfg.tokens,
            cfg.position_id_per_seconds,
            device,
            decode,
            graphs,
            _prefill(engine, budget, prefill),
            speech_cap=model.speech_cap,
        )
        storage = kv_storage(cfg.talker.text, opts.talker_kv_bytes, engine.page_size, dtype, device)
        stream = VocoderStreamConfig(
            opts.vocoder_chunk_frames, opts.vocoder_first_chunk_frames, opts.vocoder_talker_speed
        )
        vocoder = VocoderProgram(parts["code2wav"], stream, voice, engine.max_running, opts.vocoder_max_batch, graphs)
        stages += [
            KVStage(
                "talker",
                talker,
                storage,
                KVStageConfig(budget, engine.max_running, decode, prefill, engine.prefix_cache),
                device,
            ),
            BatchStage("vocoder", vocoder, BatchStageConfig(2**31, engine.max_running), voice),
        ]
    return stages


def _prefill(engine: EngineConfig, budget: int, attention: str) -> PrefillPlan:
    return PrefillPlan(min(engine.prefill_graph_max_tokens, budget), attention)


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
