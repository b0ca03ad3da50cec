"""Qwen3-Omni make-tiny checkpoints, an ``Omni`` per checkpoint, the requests the tests share (text, media,
speech) and HF's inputs for the same media."""

import base64
import io
import tempfile
import wave
from functools import cache

import numpy as np
import torch
from helpers.hf_oracle import TEST_ROOT, config_dict

from omniwalk import Omni
from omniwalk.media.mel import log_mel
from omniwalk.models.qwen3_omni.checkpoint.tiny import make_tiny_checkpoint
from omniwalk.models.qwen3_omni.processing.media_inputs import vision_pixels

MESSAGES = [
    {"role": "user", "content": "hello world"},
    {"role": "assistant", "content": "good morning"},
    {"role": "user", "content": [{"type": "text", "text": "tell me a story about the weather"}]},
]


@cache
def checkpoint(name: str) -> str:
    return str(make_tiny_checkpoint(tempfile.mkdtemp(prefix=f"omni_{name}_", dir=TEST_ROOT), config_dict(name)))


@cache
def omni(name: str = "tiny", **options) -> Omni:
    return Omni(model=checkpoint(name), **options)


def greedy(n=64, **kw):
    return {"messages": MESSAGES, "max_tokens": n, "min_tokens": n, "temperature": 0.0, **kw}


RNG = np.random.default_rng(1)


AUDIO = (0.1 * RNG.standard_normal(16000 * 2 + 300)).astype(np.float32)


IMAGE = RNG.integers(0, 256, (90, 130, 3), dtype=np.uint8)


VIDEO = RNG.integers(0, 256, (8, 64, 96, 3), dtype=np.uint8)


def wav_data_url(samples: np.ndarray) -> str:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return "data:audio/wav;base64," + base64.b64encode(buf.getvalue()).decode()


IMAGE_B = RNG.integers(0, 256, (64, 224, 3), dtype=np.uint8)


AUDIO_B = (0.1 * RNG.standard_normal(12345)).astype(np.float32)


def _user(*parts):
    return {
        "messages": [
            {"role": "user", "content": [p if isinstance(p, dict) else {"type": "text", "text": p} for p in parts]}
        ]
    }


REQUESTS = {
    "audio": _user({"type": "audio", "audio": AUDIO}, "what is said"),
    "image": _user({"type": "image", "image": IMAGE}, "describe it"),
    "image_audio_image": _user(
        {"type": "image", "image": IMAGE_B},
        "first",
        {"type": "audio", "audio": AUDIO_B},
        {"type": "image", "image": IMAGE},
        "compare",
    ),
    "multi_turn": {
        "messages": [
            {"role": "user", "content": [{"type": "image", "image": IMAGE}, {"type": "text", "text": "what is it"}]},
            {"role": "assistant", "content": "a picture"},
            {"role": "user", "content": "are you sure"},
        ]
    },
    "audio_image": {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "audio", "audio": AUDIO},
                    {"type": "image", "image": IMAGE},
                    {"type": "text", "text": "what is it"},
                ],
            }
        ]
    },
    "video": {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "video", "video": VIDEO, "fps": 2.0}, {"type": "text", "text": "describe"}],
            }
        ]
    },
    "audio_in_video": {
        "use_audio_in_video": True,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "video", "video": VIDEO, "fps": 1.0, "audio": AUDIO},
                    {"type": "text", "text": "listen"},
                ],
            }
        ],
    },
}


def hf_inputs(prompt, use_audio_in_video):
    items = prompt.items
    ids = torch.tensor([prompt.token_ids])
    out = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "use_audio_in_video": use_audio_in_video}
    waves = [i.data["audio"] for i in items if i.kind == "audio" or (use_audio_in_video and i.num_audio_tokens)]
    if waves:
        features, frames = log_mel([torch.from_numpy(w) for w in waves])
        out["input_features"] = features
        out["feature_attention_mask"] = (torch.arange(features.shape[-1])[None] < frames[:, None]).long()
    for kind, pixels, grid in (
        ("image", "pixel_values", "image_grid_thw"),
        ("video", "pixel_values_videos", "video_grid_thw"),
    ):
        chosen = [i for i in items if i.kind == kind]
        if chosen:
            out[pixels] = torch.cat([vision_pixels(i, "cpu") for i in chosen])
            out[grid] = torch.tensor([i.grid_thw for i in chosen])
    if any(i.kind == "video" for i in items):
        out["video_second_per_grid"] = torch.tensor([i.seconds_per_grid for i in items if i.kind == "video"])
    return out


TEXT_TOKENS, FRAMES = 10, 32


def greedy_speech(messages, voice="ethan", **extra):
    return {
        "messages": messages,
        "modalities": ["text", "audio"],
        "voice": voice,
        "max_tokens": TEXT_TOKENS,
        "min_tokens": TEXT_TOKENS,
        "temperature": 0.0,
        "talker_temperature": 0.0,
        "code_predictor_temperature": 0.0,
        "min_audio_frames": FRAMES,
        "max_audio_frames": FRAMES,
        **extra,
    }
