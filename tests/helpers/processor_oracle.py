"""HF's chat template and ``Qwen3OmniMoeProcessor`` around a make-tiny checkpoint (its video processor a
grid-only stand-in unless a test swaps in HF's), our ``ChatProcessor`` for the same checkpoint, and the
conversations both are compared on."""

from functools import cache

import numpy as np
import torch
from helpers.hf_oracle import whisper_extractor
from transformers import AutoTokenizer, Qwen3OmniMoeProcessor
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from omniwalk.models.common.processing.chat import ChatProcessor
from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig
from omniwalk.models.qwen3_omni.checkpoint.tiny import make_tiny_checkpoint
from omniwalk.models.qwen3_omni.family import DEFAULT_SYSTEM_PROMPT
from omniwalk.tokenizer import Tokenizer

HF_TOKEN_NAMES = {
    "image_token": "<|image_pad|>",
    "audio_token": "<|audio_pad|>",
    "video_token": "<|video_pad|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
}


RNG = np.random.default_rng(0)


AUDIO_A = RNG.standard_normal(16000 * 3 + 77).astype(np.float32)


AUDIO_B = RNG.standard_normal(12345).astype(np.float32)


IMAGE_A = RNG.integers(0, 256, (100, 150, 3), dtype=np.uint8)


IMAGE_B = RNG.integers(0, 256, (64, 224, 3), dtype=np.uint8)


VIDEO = RNG.integers(0, 256, (6, 64, 96, 3), dtype=np.uint8)


class GridOnlyVideoProcessor:
    temporal_patch_size, merge_size = 2, 2

    def __call__(self, videos, **kwargs):
        return {
            "video_grid_thw": torch.tensor([[-(-v.shape[0] // 2), v.shape[1] // 16, v.shape[2] // 16] for v in videos])
        }


@cache
def checkpoint(tmp="processor"):
    import tempfile

    from helpers.hf_oracle import TEST_ROOT

    return make_tiny_checkpoint(tempfile.mkdtemp(prefix=tmp, dir=TEST_ROOT))


def hf_image_processor(size: dict | None = None) -> Qwen2VLImageProcessorPil:
    """HF's PIL image processor with Qwen3-Omni's settings (16-pixel patches, 2-frame groups, 2x2 merge,
    mean/std 0.5); ``size`` overrides the pixel bounds (the video processor's are 128..768 merged tokens)."""
    return Qwen2VLImageProcessorPil(
        patch_size=16,
        temporal_patch_size=2,
        merge_size=2,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
        size=size or {"shortest_edge": 3136, "longest_edge": 12845056},
    )


@cache
def hf_processor():
    tok = AutoTokenizer.from_pretrained(checkpoint(), extra_special_tokens=HF_TOKEN_NAMES)
    p = object.__new__(Qwen3OmniMoeProcessor)  # skips the class checks that want torchvision
    p.tokenizer, p.chat_template, p.video_processor = tok, tok.chat_template, GridOnlyVideoProcessor()
    p.feature_extractor = whisper_extractor()
    p.image_processor = hf_image_processor()
    for name in [*HF_TOKEN_NAMES, "image_token_id", "audio_token_id", "video_token_id"]:
        setattr(p, name, getattr(tok, name))
    return p


@cache
def ours() -> ChatProcessor:
    ckpt = checkpoint()
    return ChatProcessor(Qwen3OmniConfig.from_hf(ckpt), Tokenizer.from_dir(ckpt), DEFAULT_SYSTEM_PROMPT)


def user(*parts):
    return {"role": "user", "content": [p if isinstance(p, dict) else {"type": "text", "text": p} for p in parts]}


A, B = {"type": "audio", "audio": AUDIO_A}, {"type": "audio", "audio": AUDIO_B}


I1, I2 = {"type": "image", "image": IMAGE_A}, {"type": "image", "image": IMAGE_B}


V = {"type": "video", "video": VIDEO, "fps": 2.0}


VA = {"type": "video", "video": VIDEO, "fps": 1.0, "audio": AUDIO_A}


CASES = {
    "text": [user("What is the capital of France?")],
    "audio": [user(A, "What is said?")],
    "image": [user(I1, "Describe it.")],
    "video": [user(V, "What happens?")],
    "audio_image": [user(A, I1, "Relate the sound to the picture.")],
    "image_audio_image": [user(I2, "first", B, I1, "compare")],
    "multi_turn": [user(I1, "What is it?"), {"role": "assistant", "content": "A picture."}, user("Sure?")],
    "audio_in_video": [user(VA, "What is said in the video?")],
}


def hf_call(messages, use_audio_in_video):
    """HF template + processor on the same messages (our default system turn made explicit)."""
    p = hf_processor()
    full = [{"role": "system", "content": DEFAULT_SYSTEM_PROMPT}, *messages]
    text = p.apply_chat_template(full, add_generation_prompt=True, tokenize=False)
    parts = [part for m in messages if isinstance(m["content"], list) for part in m["content"]]
    kwargs = {}
    audio = [part["audio"] for part in parts if part["type"] == "audio"]
    images = [part["image"] for part in parts if part["type"] == "image"]
    videos = [part for part in parts if part["type"] == "video"]
    if use_audio_in_video:
        audio, kwargs = [v["audio"] for v in videos], {"use_audio_in_video": True, "audio_from_video_indices": [0]}
    if videos:
        kwargs["fps"] = videos[0]["fps"]
    out = p(
        text=text,
        audio=audio or None,
        images=images or None,
        videos=[v["video"] for v in videos] or None,
        return_tensors="pt",
        **kwargs,
    )
    return out
