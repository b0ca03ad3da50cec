"""Qwen3-Omni's section of the config: its per-stage budgets (``Omni`` keywords, ``omniwalk serve`` flags)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from omniwalk.errors import ConfigError


@dataclass(frozen=True)
class Qwen3OmniOptions:
    thinker_kv_bytes: int = 256 * 2**20  # KV pool of the thinker (all layers, keys + values)
    talker_kv_bytes: int = 64 * 2**20
    talker_max_batch_tokens: int = 0  # the talker's token budget per step; 0 = the engine's max_batch_tokens
    audio_encoder_batch_units: int = 65536  # mel frames per audio encoder call
    # patches per vision encoder call: about two 640x480 images (1,200 patches each); an item larger
    # than this runs alone. Smaller calls let the first images of a burst reach the thinker sooner
    # (docs/performance.md)
    vision_encoder_batch_units: int = 2400
    # codec frames in a stream's audio chunks (12.5 frames = 1 s): a small first chunk (earlier first
    # audio), then chunks that grow as fast as playback stays fed while the talker makes frames at
    # vocoder_talker_speed x real time: at 2, 5, 5, 10, 20, 25, 25, ... (chunks at most double); lower
    # for a talker that runs nearer real time under load (networks/code2wav_stream.py: VocoderStreamConfig)
    vocoder_chunk_frames: int = 25
    vocoder_first_chunk_frames: int = 5
    vocoder_talker_speed: float = 2.0
    # streams decoded in one vocoder call; 1 = each stream alone: audio bit-identical whatever else
    # runs (CPU kernels, like GPU ones, round differently at other batch sizes), at a throughput cost
    vocoder_max_batch: int = 64

    def __post_init__(self):
        for f in fields(self):
            least = 0 if f.name == "talker_max_batch_tokens" else 1
            if getattr(self, f.name) < least:
                raise ConfigError(f"{f.name} must be >= {least}, got {getattr(self, f.name)}")
        if not self.vocoder_talker_speed > 1:  # (at real time no chunk after the first would come in time)
            raise ConfigError(f"vocoder_talker_speed must be > 1, got {self.vocoder_talker_speed}")
