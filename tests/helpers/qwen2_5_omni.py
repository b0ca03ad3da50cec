"""Qwen2.5-Omni make-tiny checkpoints, an ``Omni`` and HF's model per checkpoint, the requests the tests
share, and HF's inputs for the same media."""

import tempfile
from functools import cache

import numpy as np
import torch
from helpers.hf_oracle import TEST_ROOT
from helpers.qwen2_5_oracle import config_dict

from omniwalk import Omni
from omniwalk.media.mel import log_mel
from omniwalk.models.qwen2_5_omni.checkpoint.tiny import make_tiny_checkpoint
from omniwalk.models.qwen2_5_omni.processing.media_inputs import vision_pixels

RNG = np.random.default_rng(5)


AUDIO = (0.1 * RNG.standard_normal(16000 * 3 + 123)).astype(np.float32)


AUDIO_B = (0.1 * RNG.standard_normal(9001)).astype(np.float32)


IMAGE = RNG.integers(0, 256, (90, 130, 3), dtype=np.uint8)


IMAGE_B = RNG.integers(0, 256, (60, 200, 3), dtype=np.uint8)


VIDEO = RNG.integers(0, 256, (8, 64, 96, 3), dtype=np.uint8)


MESSAGES = [
    {"role": "user", "content": "hello world"},
    {"role": "assistant", "content": "good morning"},
    {"role": "user", "content": [{"type": "text", "text": "tell me a story about the weather"}]},
]


def _user(*parts, **extra):
    content = [p if isinstance(p, dict) else {"type": "text", "text": p} for p in parts]
    return {"messages": [{"role": "user", "content": content}], **extra}


REQUESTS = {
    "text": {"messages": MESSAGES},
    "audio": _user({"type": "audio", "audio": AUDIO}, "what is said"),
    "image": _user({"type": "image", "image": IMAGE}, "describe it"),
    "video": _user({"type": "video", "video": VIDEO, "fps": 2.0}, "describe"),
    "image_audio_image": _user(
        {"type": "image", "image": IMAGE_B},
        "first",
        {"type": "audio", "audio": AUDIO_B},
        {"type": "image", "image": IMAGE},
        "compare",
    ),
    "audio_in_video": _user(
        {"type": "video", "video": VIDEO, "fps": 1.0, "audio": AUDIO}, "listen", use_audio_in_video=True
    ),
}


@cache
def checkpoint(name: str) -> str:
    return str(make_tiny_checkpoint(tempfile.mkdtemp(prefix=f"omni25_{name}_", dir=TEST_ROOT), config_dict(name)))


@cache
def omni(name: str = "tiny") -> Omni:
    return Omni(model=checkpoint(name))


@cache
def hf(name: str):
    from transformers import Qwen2_5OmniForConditionalGeneration

    return Qwen2_5OmniForConditionalGeneration.from_pretrained(checkpoint(name)).eval()


def hf_inputs(prompt, use_audio_in_video: bool) -> dict:
    """HF thinker inputs for our prompt: the same ids and the same preprocessed media."""
    items = prompt.items
    ids = torch.tensor([prompt.token_ids])
    out = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "use_audio_in_video": use_audio_in_video}
    waves = [i.data["audio"] for i in items if i.kind == "audio" or (use_audio_in_video and i.num_audio_tokens)]
    if waves:
        features, frames = log_mel([torch.from_numpy(w) for w in waves], zero_tail=True)
        out["input_features"] = features
        out["feature_attention_mask"] = (torch.arange(features.shape[-1])[None] < frames[:, None]).long()
    kinds = (("image", "pixel_values", "image_grid_thw"), ("video", "pixel_values_videos", "video_grid_thw"))
    for kind, pixels, grid in kinds:
        chosen = [i for i in items if i.kind == kind]
        if chosen:
            out[pixels] = torch.cat([vision_pixels(i, "cpu") for i in chosen])
            out[grid] = torch.tensor([i.grid_thw for i in chosen])
    if any(i.kind == "video" for i in items):
        out["video_second_per_grid"] = torch.tensor([i.seconds_per_grid for i in items if i.kind == "video"])
    return out
