"""Qwen2.5-Omni model config, normalised once from a checkpoint's ``config.json``.

``Qwen25OmniConfig.from_hf(path_or_dict)`` reads what HF transformers' ``save_pretrained`` writes
(``rope_parameters``) and the published form (``rope_scaling`` + ``rope_theta``, token ids as
``*_token_index``), fills optional keys with the HF class defaults (``Qwen2_5Omni*Config``,
transformers 5.24) and checks the cross-component invariants; errors name the field's JSON path.

The thinker and talker LMs are dense Qwen2.5 decoders (``DecoderConfig`` with biased q/k/v, no
q/k norm, sectioned MRoPE). ``token2wav_config`` (the DiT + BigVGAN) is read by the token2wav
networks' reader (``networks/token2wav.py``) when audio output is enabled.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omniwalk.errors import ConfigError
from omniwalk.layers.decoder import DecoderConfig
from omniwalk.models.common.checkpoint.config import TokenIds, read_decoder
from omniwalk.models.json_fields import Section, read_config
from omniwalk.models.qwen2_5_omni.networks.token2wav import Token2WavConfig

# Qwen2 vocabulary ids with no config.json key of their own (the role words of the chat layout)
SYSTEM_TOKEN, ASSISTANT_TOKEN = 8948, 77091


@dataclass(frozen=True)
class AudioEncoderConfig:
    """Whisper-style encoder: conv1d frontend, chunked attention, pairwise average pooling."""

    d_model: int
    encoder_layers: int
    encoder_attention_heads: int
    encoder_ffn_dim: int
    output_dim: int
    num_mel_bins: int = 128
    n_window: int = 100  # half a chunk: attention never crosses a chunk of 2 * n_window mel frames
    max_source_positions: int = 1500

    @property
    def head_dim(self) -> int:
        return self.d_model // self.encoder_attention_heads


@dataclass(frozen=True)
class VisionEncoderConfig:
    """Qwen2.5-VL encoder: window attention except at ``fullatt_block_indexes``, RMSNorm, SwiGLU."""

    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    in_channels: int = 3
    window_size: int = 112  # pixels per window side
    fullatt_block_indexes: tuple[int, ...] = (7, 15, 23, 31)
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def window_tokens(self) -> int:
        """Merged tokens per window side."""
        return self.window_size // self.spatial_merge_size // self.patch_size


@dataclass(frozen=True)
class TalkerConfig:
    """The dense talker LM (codec vocabulary) fed projected thinker states."""

    text: DecoderConfig
    embedding_size: int  # its codec embedding width = the thinker's hidden size
    codec_pad: int
    codec_bos: int
    codec_eos: int
    codec_mask: int
    text_bos: int  # thinker vocabulary: the tts text start / end / pad ids
    text_eos: int
    text_pad: int


@dataclass(frozen=True)
class Qwen25OmniConfig:
    text: DecoderConfig
    audio: AudioEncoderConfig
    vision: VisionEncoderConfig
    talker: TalkerConfig | None  # None when the checkpoint has no audio output
    tokens: TokenIds
    position_id_per_seconds: float
    seconds_per_chunk: float
    token2wav: Token2WavConfig | None = None  # None when the checkpoint has no audio output

    @property
    def enable_audio_output(self) -> bool:
        return self.talker is not None

    @classmethod
    def from_hf(cls, source: str | Path | dict) -> Qwen25OmniConfig:
        """Normalise a checkpoint directory, a ``config.json`` path, or its parsed dict."""
        return _read_model(Section(read_config(source), ""))


def _read_decoder(s: Section) -> DecoderConfig:
    """A dense Qwen2.5 decoder (the thinker's ``text_config`` or the talker): sectioned MRoPE."""
    return read_decoder(s, theta=1e6, multimodal=True, interleaved=False, attention_bias=True)


def _read_audio(s: Section) -> AudioEncoderConfig:
    if s.get("activation_function", "gelu", str) != "gelu":
        raise ConfigError(f"{s.name('activation_function')}: only 'gelu' is supported")
    if s.bool("scale_embedding", False):
        raise ConfigError(f"{s.name('scale_embedding')}: scaled embeddings are not supported")
    cfg = s.read(AudioEncoderConfig)
    if cfg.d_model % cfg.encoder_attention_heads or cfg.d_model % 2:
        raise ConfigError(f"{s.name('d_model')} must be even and a multiple of encoder_attention_heads")
    return cfg


def _read_vision(s: Section) -> VisionEncoderConfig:
    if s.get("hidden_act", "silu", str) != "silu":
        raise ConfigError(f"{s.name('hidden_act')}: only 'silu' is supported")
    theta = float((s.data.get("rope_parameters") or {}).get("rope_theta", 1e4))
    fullatt = s.ints("fullatt_block_indexes", VisionEncoderConfig.fullatt_block_indexes)
    cfg = s.read(VisionEncoderConfig, rope_theta=theta, fullatt_block_indexes=fullatt)
    if cfg.hidden_size % cfg.num_heads or cfg.head_dim % 4:
        raise ConfigError(f"{s.name('hidden_size')}/num_heads must be a multiple of 4 (2-D rotary)")
    if cfg.window_tokens < 1:
        raise ConfigError(f"{s.name('window_size')} must be >= patch_size * spatial_merge_size")
    for i in cfg.fullatt_block_indexes:
        if not 0 <= i < cfg.depth:
            raise ConfigError(f"{s.name('fullatt_block_indexes')}: index {i} is outside depth {cfg.depth}")
    return cfg


def _token(s: Section, key: str, default: int) -> int:
    """A token id under ``key`` or its ``*_token_index`` spelling (what HF writes)."""
    index_key = key.replace("_token_id", "_token_index")
    return s.int(index_key if key not in s.data and index_key in s.data else key, default, minimum=0)


def _read_tokens(thinker: Section, talker: Section) -> TokenIds:
    return TokenIds(
        im_start=thinker.int("bos_token_id", 151644, minimum=0),
        im_end=thinker.int("eos_token_id", 151645, minimum=0),
        system=thinker.int("system_token_id", SYSTEM_TOKEN, minimum=0),
        user=thinker.int("user_token_id", 872, minimum=0),
        assistant=thinker.int("assistant_token_id", ASSISTANT_TOKEN, minimum=0),
        audio_pad=_token(thinker, "audio_token_id", 151646),
        image_pad=_token(thinker, "image_token_id", 151655),
        video_pad=_token(thinker, "video_token_id", 151656),
        audio_start=thinker.int("audio_start_token_id", 151647, minimum=0),
        audio_end=thinker.int("audio_end_token_id", 151648, minimum=0),
        vision_start=thinker.int("vision_start_token_id", talker.int("vision_start_token_id", 151652, minimum=0)),
        vision_end=thinker.int("vision_end_token_id", talker.int("vision_end_token_id", 151653, minimum=0)),
        tts_pad=talker.int("tts_text_pad_token_id", 151859, minimum=0),
        tts_bos=talker.int("tts_text_start_token_id", 151860, minimum=0),
        tts_eos=talker.int("tts_text_end_token_id", 151861, minimum=0),
    )


def _read_talker(s: Section) -> TalkerConfig:
    return TalkerConfig(
        text=_read_decoder(s),
        embedding_size=s.int("embedding_size"),
        codec_pad=s.int("tts_codec_pad_token_id", 8292, minimum=0),
        codec_bos=s.int("tts_codec_start_token_id", 8293, minimum=0),
        codec_eos=s.int("tts_codec_end_token_id", 8294, minimum=0),
        codec_mask=s.int("tts_codec_mask_token_id", 8296, minimum=0),
        text_bos=s.int("tts_text_start_token_id", 151860, minimum=0),
        text_eos=s.int("tts_text_end_token_id", 151861, minimum=0),
        text_pad=s.int("tts_text_pad_token_id", 151859, minimum=0),
    )


def _read_model(top: Section) -> Qwen25OmniConfig:
    thinker = top.section("thinker_config")
    speaks = top.bool("enable_audio_output", True)
    talker_section = top.section("talker_config") if speaks or "talker_config" in top.data else Section({}, "")
    cfg = Qwen25OmniConfig(
        text=_read_decoder(thinker.section("text_config")),
        audio=_read_audio(thinker.section("audio_config")),
        vision=_read_vision(thinker.section("vision_config")),
        talker=_read_talker(talker_section) if speaks else None,
        tokens=_read_tokens(thinker, talker_section),
        position_id_per_seconds=thinker.float("position_id_per_seconds", 25.0),
        seconds_per_chunk=thinker.float("seconds_per_chunk", 2.0),
        token2wav=Token2WavConfig.from_hf(top.section("token2wav_config")) if speaks else None,
    )
    _check_consistency(cfg)
    return cfg


def _check_consistency(cfg: Qwen25OmniConfig) -> None:
    hidden = cfg.text.hidden_size
    widths = [
        ("thinker_config.audio_config.output_dim", cfg.audio.output_dim),
        ("thinker_config.vision_config.out_hidden_size", cfg.vision.out_hidden_size),
    ]
    if cfg.talker is not None:
        widths.append(("talker_config.embedding_size", cfg.talker.embedding_size))
    for name, value in widths:
        if value != hidden:
            raise ConfigError(f"{name} = {value} must equal thinker_config.text_config.hidden_size = {hidden}")
    for name, value in vars(cfg.tokens).items():
        if not 0 <= value < cfg.text.vocab_size:
            raise ConfigError(f"token id {name} = {value} is outside the thinker vocabulary ({cfg.text.vocab_size})")
    if cfg.talker is not None:
        t = cfg.talker
        for name in ("codec_pad", "codec_bos", "codec_eos", "codec_mask"):
            if not 0 <= getattr(t, name) < t.text.vocab_size:
                raise ConfigError(f"talker_config {name} = {getattr(t, name)} is outside the codec vocabulary")
