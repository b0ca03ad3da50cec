"""Qwen2.5-Omni as a graph for the walk runtime: its stages, and each request's walk through them.

    audio_encoder ─┐
                   ├─► thinker ─(reply states, streaming)─► talker ─(codec ids, streaming)─► token2wav
    vision_encoder ┘

The encoders are batch stages, the thinker and talker KV stages on the engine as it is; the
programs, per-request state and thinker program are the shared ones where the work is the same
(``models/common/programs``). A request visits the encoders its media need, always the thinker, and
the talker and token2wav only when it asks for audio. Token2wav is a batch stage
(``programs/token2wav_program.py``): a streamed request's audio comes window by window as its
codes arrive; any other request's is one decode of the whole utterance once the talker ends.
"""

from __future__ import annotations

from omniwalk.config import OmniConfig
from omniwalk.engine.batch_stage import BatchStage, BatchStageConfig
from omniwalk.engine.kv_stage import KVStage, KVStageConfig
from omniwalk.engine.prefill_graphs import PrefillPlan
from omniwalk.models.common.processing.chat import Prompt
from omniwalk.models.common.processing.positions import AUDIO
from omniwalk.models.common.programs.encoder_programs import AudioEncoderProgram
from omniwalk.models.common.programs.request_state import MediaState, OmniRequestState, ThinkerState
from omniwalk.models.common.programs.thinker_program import kv_storage
from omniwalk.models.qwen2_5_omni.checkpoint.config import Qwen25OmniConfig
from omniwalk.models.qwen2_5_omni.networks.token2wav_stream import Token2WavStreamConfig
from omniwalk.models.qwen2_5_omni.options import Qwen25OmniOptions
from omniwalk.models.qwen2_5_omni.programs.encoder_programs import VisionEncoderProgram
from omniwalk.models.qwen2_5_omni.programs.talker_program import TalkerProgram, TalkerState
from omniwalk.models.qwen2_5_omni.programs.thinker_program import ReplyThinkerProgram
from omniwalk.models.qwen2_5_omni.programs.token2wav_program import Token2WavProgram, Token2WavState
from omniwalk.sampling import SamplerState, SamplingParams
from omniwalk.tokenizer import IncrementalDetokenizer


def build_stages(
    parts: dict, cfg: Qwen25OmniConfig, config: OmniConfig, voices: dict | None = None, adapters=None
) -> list:
    """The engine stages over loaded components (``checkpoint/loader.py`` names) for a resolved
    config; ``voices``: the checkpoint's speakers (``spk_dict.pt``), for token2wav; ``adapters``: the
    thinker's LoRA adapters (``ThinkerAdapters``) or None."""
    model, engine, opts = config.model, config.engine, config.family or Qwen25OmniOptions()
    dtype, device = model.torch_dtype, model.device
    decode, prefill = model.decode_attention, model.attention_backend
    graphs = min(engine.cuda_graph_max_batch, engine.max_running)
    audio_batch = BatchStageConfig(opts.audio_encoder_batch_units, engine.max_running)
    vision_batch = BatchStageConfig(opts.vision_encoder_batch_units, engine.max_running)
    plan = PrefillPlan(min(engine.prefill_graph_max_tokens, engine.max_batch_tokens), prefill)
    thinker = ReplyThinkerProgram(parts["thinker"], device, decode, graphs, plan, 0, adapters)
    encoder_graphs = engine.encoder_graph_max_tokens
    audio = AudioEncoderProgram(parts["audio_encoder"], device, dtype, zero_tail=True, graph_max_tokens=encoder_graphs)
    vision = VisionEncoderProgram(parts["vision_encoder"], device, dtype, encoder_graphs)
    thinker_kv = kv_storage(cfg.text, opts.thinker_kv_bytes, engine.page_size, dtype, device)
    stages = [
        BatchStage("audio_encoder", audio, audio_batch, device),
        BatchStage("vision_encoder", vision, vision_batch, device),
        KVStage(
            "thinker",
            thinker,
            thinker_kv,
            KVStageConfig(engine.max_batch_tokens, engine.max_running, decode, prefill, engine.prefix_cache),
            device,
        ),
    ]
    if "talker" in parts:
        budget = opts.talker_max_batch_tokens or engine.max_batch_tokens
        num_codes = cfg.token2wav.dit.num_embeds + 1
        talker_plan = PrefillPlan(min(engine.prefill_graph_max_tokens, budget), prefill)
        talker = TalkerProgram(
            parts["talker"],
            parts["thinker"],
            cfg.talker,
            device,
            num_codes,
            decode,
            graphs,
            talker_plan,
            speech_cap=model.speech_cap,
        )
        storage = kv_storage(cfg.talker.text, opts.talker_kv_bytes, engine.page_size, dtype, device)
        stream = Token2WavStreamConfig(opts.token2wav_chunk_blocks)
        token2wav = Token2WavProgram(
            parts["token2wav"], voices or {}, device, stream, lambda req: req.state.talker.token2wav, graphs
        )
        stages += [
            KVStage("talker", talker, storage, KVStageConfig(budget, engine.max_running, decode, prefill), device),
            BatchStage(
                "token2wav", token2wav, BatchStageConfig(opts.token2wav_batch_frames, engine.max_running), device
            ),
        ]
    return stages


def new_state(
    prompt: Prompt,
    params: SamplingParams,
    max_tokens: int,
    detok: IncrementalDetokenizer,
    cfg: Qwen25OmniConfig,
    *,
    use_audio_in_video: bool = False,
    speech: SamplingParams | None = None,
    speaker_bos: int = 0,
    token2wav: Token2WavState | None = None,
) -> tuple[tuple[str, ...], OmniRequestState]:
    """A processed request -> (its walk, its state)."""
    items = prompt.items
    waves = [i.data["audio"] for i in items if i.kind == AUDIO or (use_audio_in_video and i.num_audio_tokens)]
    vision = [i for i in items if i.kind != AUDIO]
    sampler = SamplerState(params, (cfg.tokens.im_end,), prompt.token_ids)
    thinker = ThinkerState(prompt, params, sampler, detok, max_tokens, list(prompt.token_ids))
    state = OmniRequestState(MediaState(waves, vision), thinker, use_audio_in_video=use_audio_in_video)
    walk = (("audio_encoder",) if waves else ()) + (("vision_encoder",) if vision else ()) + ("thinker",)
    if speech is not None and token2wav is not None:
        t = cfg.talker
        codec_prompt = [t.codec_mask] * prompt.num_prompt_tokens + [t.codec_pad, t.codec_bos]
        sampler = SamplerState(speech, (t.codec_pad, t.codec_eos), codec_prompt)
        state.talker = TalkerState(sampler, speaker_bos, speech.max_tokens, token2wav)
        walk += ("talker", "token2wav")
    return walk, state
