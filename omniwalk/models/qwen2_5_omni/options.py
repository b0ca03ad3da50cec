"""Qwen2.5-Omni's section of the config: its per-stage budgets (``Omni`` keywords, ``omniwalk serve``
flags). Fields named as Qwen3-Omni's share their flags (same meaning, same defaults)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from omniwalk.errors import ConfigError


@dataclass(frozen=True)
class Qwen25OmniOptions:
    thinker_kv_bytes: int = 256 * 2**20  # KV pool of the thinker (all layers, keys + values)
    talker_kv_bytes: int = 64 * 2**20
    talker_max_batch_tokens: int = 0  # the talker's token budget per step; 0 = the engine's max_batch_tokens
    audio_encoder_batch_units: int = 65536  # mel frames per audio encoder call
    # patches per vision encoder call (an item larger than this runs alone): Qwen3-Omni's value (smaller
    # calls let a burst's first images reach the thinker sooner), not tuned for this encoder, whose
    # 14-pixel patches make it about 1.5 640x480 images
    vision_encoder_batch_units: int = 2400
    token2wav_batch_frames: int = 16384  # mel frames of DiT rows per batched ODE step (a longer lone row runs alone)
    token2wav_chunk_blocks: int = 3  # DiT blocks a streamed audio chunk emits (the reference's 3: 0.72 s)

    def __post_init__(self):
        for f in fields(self):
            least = 0 if f.name == "talker_max_batch_tokens" else 1
            if getattr(self, f.name) < least:
                raise ConfigError(f"{f.name} must be >= {least}, got {getattr(self, f.name)}")
