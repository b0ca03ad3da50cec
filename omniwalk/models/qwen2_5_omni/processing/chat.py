"""Chat messages -> Qwen2.5-Omni thinker prompt: the shared three steps (``models/common/processing/
chat.py``: normalise the messages, render the checkpoint's template, expand placeholders) with this
model's audio-in-video order and TMRoPE positions (``positions.py``)."""

from __future__ import annotations

import functools

from omniwalk.models.common.processing import chat
from omniwalk.models.common.processing.chat import MediaItem, Prompt, expand_placeholders
from omniwalk.models.qwen2_5_omni.processing.positions import audio_video_order, tmrope_positions

# the system turn of a request without one (as HF's Qwen2.5-Omni examples give it)
DEFAULT_SYSTEM_PROMPT = (
    "You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of perceiving auditory and "
    "visual inputs, as well as generating text and speech."
)


class ChatProcessor(chat.ChatProcessor):
    def build(self, ids: list[int], items: list[MediaItem], use_audio_in_video: bool = False) -> Prompt:
        c = self.cfg
        order = functools.partial(audio_video_order, chunk_seconds=c.seconds_per_chunk)
        merge, pos_per_s = c.vision.spatial_merge_size, c.position_id_per_seconds
        ids, spans = expand_placeholders(ids, items, c.tokens, merge, use_audio_in_video, pos_per_s, order)
        rope = tmrope_positions(len(ids), spans, pos_per_s, c.seconds_per_chunk)
        return Prompt(ids, spans, list(items), rope)
