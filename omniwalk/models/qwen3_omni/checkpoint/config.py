"""Qwen3-Omni model config, normalised once from a checkpoint's ``config.json``.

``Qwen3OmniConfig.from_hf(path_or_dict)`` reads both the published form (``rope_scaling`` +
``rope_theta``) and the transformers >= 5 form (``rope_parameters``), reads the undeclared keys
the real checkpoint relies on (``head_dim``, ``shared_expert_intermediate_size``,
``vision_start_token_id``, ...), fills optional keys with the HF class defaults, and checks the
cross-component invariants. The MRoPE of its decoders is interleaved whatever the config's
``interleaved`` flag says (as in HF 5.24). Every error names the offending field by its JSON path.

Model code reads these frozen dataclasses only, never raw dicts; special token ids live in
``TokenIds`` / ``CodecIds`` and are never written as literals elsewhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from omniwalk.errors import ConfigError
from omniwalk.layers.decoder import DecoderConfig
from omniwalk.models.common.checkpoint.config import TokenIds, read_decoder, read_rope
from omniwalk.models.json_fields import Section as _Section
from omniwalk.models.json_fields import read_config


@dataclass(frozen=True)
class AudioEncoderConfig:
    d_model: int
    encoder_layers: int
    encoder_attention_heads: int
    encoder_ffn_dim: int
    output_dim: int
    num_mel_bins: int = 128
    downsample_hidden_size: int = 480
    n_window: int = 50  # half a chunk: chunks are 2 * n_window mel frames
    n_window_infer: int = 800  # attention window in mel frames
    conv_chunksize: int = 500
    max_source_positions: int = 1500

    @property
    def head_dim(self) -> int:
        return self.d_model // self.encoder_attention_heads


def _read_audio(s: _Section) -> AudioEncoderConfig:
    act = s.get("activation_function", "gelu", str)
    if act != "gelu":
        raise ConfigError(f"{s.name('activation_function')}: only 'gelu' is supported, got {act!r}")
    cfg = s.read(AudioEncoderConfig)
    if cfg.d_model % cfg.encoder_attention_heads:
        raise ConfigError(f"{s.name('d_model')} must be a multiple of encoder_attention_heads")
    if cfg.n_window_infer % (2 * cfg.n_window):
        raise ConfigError(f"{s.name('n_window_infer')} must be a multiple of 2 * n_window = {2 * cfg.n_window}")
    return cfg


@dataclass(frozen=True)
class VisionEncoderConfig:
    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    in_channels: int = 3
    num_position_embeddings: int = 2304
    deepstack_visual_indexes: tuple[int, ...] = (8, 16, 24)
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Length of one flattened patch vector: C * t * p * p."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2


def _read_vision(s: _Section) -> VisionEncoderConfig:
    act = s.get("hidden_act", "gelu_pytorch_tanh", str)
    if act != "gelu_pytorch_tanh":
        raise ConfigError(f"{s.name('hidden_act')}: only 'gelu_pytorch_tanh' is supported, got {act!r}")
    cfg = s.read(VisionEncoderConfig, rope_theta=float((s.data.get("rope_parameters") or {}).get("rope_theta", 1e4)))
    if cfg.hidden_size % cfg.num_heads or cfg.head_dim % 4:
        raise ConfigError(f"{s.name('hidden_size')}/num_heads must be a multiple of 4 (2-D rotary)")
    side = math.isqrt(cfg.num_position_embeddings)
    if side * side != cfg.num_position_embeddings:
        raise ConfigError(f"{s.name('num_position_embeddings')} must be a square, got {cfg.num_position_embeddings}")
    for i in cfg.deepstack_visual_indexes:
        if not 0 <= i < cfg.depth:
            raise ConfigError(f"{s.name('deepstack_visual_indexes')}: index {i} is outside depth {cfg.depth}")
    return cfg


@dataclass(frozen=True)
class CodecIds:
    """Special ids of the talker's codec vocabulary."""

    pad: int
    bos: int
    eos: int
    nothink: int
    think_bos: int
    think_eos: int


@dataclass(frozen=True)
class TalkerConfig:
    text: DecoderConfig  # the MoE talker LM; vocab = codec vocabulary
    code_predictor: DecoderConfig  # dense, 1-D rope
    num_code_groups: int
    thinker_hidden_size: int
    accept_hidden_layer: int
    codec: CodecIds
    speakers: tuple[tuple[str, int], ...]  # (lower-case name, codec id), sorted by name

    @property
    def speaker_ids(self) -> dict[str, int]:
        return dict(self.speakers)


@dataclass(frozen=True)
class Code2WavConfig:
    codebook_size: int
    num_quantizers: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    rope_theta: float
    decoder_dim: int
    sliding_window: int = 72
    rms_norm_eps: float = 1e-5
    layer_scale_initial_scale: float = 0.01
    max_position_embeddings: int = 8000
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    upsampling_ratios: tuple[int, ...] = (2, 2)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def samples_per_frame(self) -> int:
        return math.prod(self.upsample_rates) * math.prod(self.upsampling_ratios)


def _read_code2wav(s: _Section) -> Code2WavConfig:
    act = s.get("hidden_act", "silu", str)
    if act != "silu":
        raise ConfigError(f"{s.name('hidden_act')}: only 'silu' is supported, got {act!r}")
    heads = s.int("num_attention_heads")
    theta = read_rope(s, 10000.0, 2, multimodal=False, interleaved=False).theta
    cfg = s.read(Code2WavConfig, num_key_value_heads=s.int("num_key_value_heads", heads), rope_theta=theta)
    if cfg.hidden_size % heads:
        raise ConfigError(f"{s.name('hidden_size')} must be a multiple of num_attention_heads")
    if cfg.decoder_dim % (2 ** len(cfg.upsample_rates)):
        raise ConfigError(f"{s.name('decoder_dim')} must be divisible by 2^len(upsample_rates)")
    return cfg


@dataclass(frozen=True)
class Qwen3OmniConfig:
    """The whole model: thinker (text LM + encoders), talker (+ code predictor), code2wav."""

    text: DecoderConfig
    audio: AudioEncoderConfig
    vision: VisionEncoderConfig
    talker: TalkerConfig
    code2wav: Code2WavConfig
    tokens: TokenIds
    position_id_per_seconds: float
    seconds_per_chunk: float
    enable_audio_output: bool

    @classmethod
    def from_hf(cls, source: str | Path | dict) -> Qwen3OmniConfig:
        """Normalise a checkpoint directory, a ``config.json`` path, or its parsed dict."""
        return _read_model(_Section(read_config(source), ""))


def _read_tokens(top: _Section, thinker: _Section) -> TokenIds:
    return TokenIds(
        im_start=top.int("im_start_token_id", minimum=0),
        im_end=top.int("im_end_token_id", minimum=0),
        system=top.int("system_token_id", minimum=0),
        user=top.int("user_token_id", minimum=0),
        assistant=top.int("assistant_token_id", minimum=0),
        audio_pad=thinker.int("audio_token_id", minimum=0),
        image_pad=thinker.int("image_token_id", minimum=0),
        video_pad=thinker.int("video_token_id", minimum=0),
        audio_start=thinker.int("audio_start_token_id", minimum=0),
        audio_end=thinker.int("audio_end_token_id", minimum=0),
        vision_start=thinker.int("vision_start_token_id", minimum=0),
        vision_end=thinker.int("vision_end_token_id", minimum=0),
        tts_pad=top.int("tts_pad_token_id", minimum=0),
        tts_bos=top.int("tts_bos_token_id", minimum=0),
        tts_eos=top.int("tts_eos_token_id", minimum=0),
    )


def _read_talker(s: _Section) -> TalkerConfig:
    text = read_decoder(
        s.section("text_config"), moe=True, multimodal=True, theta=1e6, norm_topk_default=False, shared_required=True
    )
    cp = read_decoder(
        s.section("code_predictor_config"),
        moe=False,
        multimodal=False,
        theta=1e4,
        norm_topk_default=False,
        shared_required=False,
    )
    speakers = s.get("speaker_id", kind=dict)
    if not speakers:
        raise ConfigError(f"{s.name('speaker_id')} must name at least one speaker")
    codec = CodecIds(
        pad=s.int("codec_pad_id", minimum=0),
        bos=s.int("codec_bos_id", minimum=0),
        eos=s.int("codec_eos_token_id", minimum=0),
        nothink=s.int("codec_nothink_id", minimum=0),
        think_bos=s.int("codec_think_bos_id", minimum=0),
        think_eos=s.int("codec_think_eos_id", minimum=0),
    )
    cfg = TalkerConfig(
        text=text,
        code_predictor=cp,
        num_code_groups=s.int("num_code_groups"),
        thinker_hidden_size=s.int("thinker_hidden_size"),
        accept_hidden_layer=s.int("accept_hidden_layer"),
        codec=codec,
        speakers=tuple(sorted((str(k).lower(), int(v)) for k, v in speakers.items())),
    )
    cp_groups = s.section("code_predictor_config").int("num_code_groups", cfg.num_code_groups)
    if cp_groups != cfg.num_code_groups:
        raise ConfigError(f"{s.name('code_predictor_config.num_code_groups')} ({cp_groups}) != num_code_groups")
    if cp.hidden_size != text.hidden_size:
        raise ConfigError(f"{s.name('code_predictor_config.hidden_size')} must equal text_config.hidden_size")
    for name, value in [*vars(codec).items(), *(("speaker_id." + k, v) for k, v in cfg.speakers)]:
        if not 0 <= value < text.vocab_size:
            raise ConfigError(f"{s.name(name)} = {value} is outside the codec vocabulary ({text.vocab_size})")
    return cfg


def _read_model(top: _Section) -> Qwen3OmniConfig:
    thinker = top.section("thinker_config")
    text = read_decoder(
        thinker.section("text_config"),
        moe=True,
        multimodal=True,
        theta=1e6,
        norm_topk_default=True,
        shared_required=False,
    )
    cfg = Qwen3OmniConfig(
        text=text,
        audio=_read_audio(thinker.section("audio_config")),
        vision=_read_vision(thinker.section("vision_config")),
        talker=_read_talker(top.section("talker_config")),
        code2wav=_read_code2wav(top.section("code2wav_config")),
        tokens=_read_tokens(top, thinker),
        position_id_per_seconds=thinker.float("position_id_per_seconds", 13.0),
        seconds_per_chunk=thinker.float("seconds_per_chunk", 2.0),
        enable_audio_output=top.bool("enable_audio_output", True),
    )
    _check_consistency(cfg, top)
    return cfg


def _check_consistency(cfg: Qwen3OmniConfig, top: _Section) -> None:
    """Cross-component invariants; each message names the field to fix."""
    hidden = cfg.text.hidden_size
    checks = [
        (cfg.audio.output_dim == hidden, "thinker_config.audio_config.output_dim", cfg.audio.output_dim),
        (
            cfg.vision.out_hidden_size == hidden,
            "thinker_config.vision_config.out_hidden_size",
            cfg.vision.out_hidden_size,
        ),
        (cfg.talker.thinker_hidden_size == hidden, "talker_config.thinker_hidden_size", cfg.talker.thinker_hidden_size),
    ]
    for ok, field, value in checks:
        if not ok:
            raise ConfigError(f"{field} = {value} must equal thinker_config.text_config.hidden_size = {hidden}")
    if not 1 <= cfg.talker.accept_hidden_layer <= cfg.text.num_hidden_layers:
        raise ConfigError(
            f"talker_config.accept_hidden_layer = {cfg.talker.accept_hidden_layer} must be in "
            f"[1, {cfg.text.num_hidden_layers}] (thinker layers)"
        )
    if cfg.code2wav.num_quantizers != cfg.talker.num_code_groups:
        raise ConfigError("code2wav_config.num_quantizers must equal talker_config.num_code_groups")
    if cfg.talker.code_predictor.vocab_size > cfg.code2wav.codebook_size:
        raise ConfigError("talker_config.code_predictor_config.vocab_size must be <= code2wav_config.codebook_size")
    for name, value in vars(cfg.tokens).items():
        if not 0 <= value < cfg.text.vocab_size:
            raise ConfigError(f"token id {name} = {value} is outside the thinker vocabulary ({cfg.text.vocab_size})")
    talker = top.section("talker_config")
    for key, expected in [("spatial_merge_size", cfg.vision.spatial_merge_size)]:
        if talker.int(key, expected) != expected:
            raise ConfigError(f"talker_config.{key} must equal thinker_config.vision_config.{key} = {expected}")
