"""HF's chat template and ``Qwen3OmniMoeProcessor`` around a make-tiny checkpoint (its video processor a
grid-only stand-in unless a test swaps in HF's), our ``ChatProcessor`` for the same checkpoint, and the
conversations both are compared on.

Hand-built thinker prompts (ids + media spans + the matching HF model inputs), for parity tests.

Placeholder runs are expanded with HF's own formulas (audio token count from
``_get_feat_extract_output_lengths``; audio-in-video order from the HF processor's
``replace_video_with_audio_token``), so the ids are an oracle independent of our processor.
Media tensors are random (random log-mel frames, random flattened patches): the thinker's
parity does not depend on them looking like real media."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from types import SimpleNamespace

import numpy as np
import torch
from helpers.hf_oracle import whisper_extractor
from transformers import AutoTokenizer, Qwen3OmniMoeProcessor
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import (
    _get_feat_extract_output_lengths,
)

from omniwalk.models.common.checkpoint.config import TokenIds
from omniwalk.models.common.processing.chat import ChatProcessor
from omniwalk.models.common.processing.positions import AUDIO, AUDIO_IN_VIDEO, IMAGE, VIDEO, MediaSpan
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


VIDEO_FRAMES = RNG.integers(0, 256, (6, 64, 96, 3), dtype=np.uint8)


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


V = {"type": "video", "video": VIDEO_FRAMES, "fps": 2.0}


VA = {"type": "video", "video": VIDEO_FRAMES, "fps": 1.0, "audio": AUDIO_A}


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


MERGE = 2
PATCH_DIM = 3 * 2 * 16 * 16
NEWLINE = 198
POS_PER_S = 13


@dataclass
class Case:
    name: str
    ids: list[int] = field(default_factory=list)
    spans: list[MediaSpan] = field(default_factory=list)
    audio_frames: list[int] = field(default_factory=list)  # mel frames per audio, prompt order
    images: list[tuple[int, int, int]] = field(default_factory=list)  # grid_thw in patches
    videos: list[tuple[tuple[int, int, int], float]] = field(default_factory=list)  # (grid_thw, fps)
    use_audio_in_video: bool = False

    def hf_inputs(self, seed: int = 0) -> dict:
        """Kwargs for HF ``thinker(...)`` / ``thinker.generate(...)`` (random media)."""
        g = torch.Generator().manual_seed(seed)
        ids = torch.tensor([self.ids])
        out = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if self.audio_frames:
            longest = max(self.audio_frames)
            out["input_features"] = torch.randn(len(self.audio_frames), 128, longest, generator=g)
            mask = torch.zeros(len(self.audio_frames), longest, dtype=torch.long)
            for i, n in enumerate(self.audio_frames):
                mask[i, :n] = 1
            out["feature_attention_mask"] = mask
        if self.images:
            out["image_grid_thw"] = torch.tensor(self.images)
            out["pixel_values"] = torch.randn(sum(t * h * w for t, h, w in self.images), PATCH_DIM, generator=g)
        if self.videos:
            grids = [grid for grid, _ in self.videos]
            out["video_grid_thw"] = torch.tensor(grids)
            out["pixel_values_videos"] = torch.randn(sum(t * h * w for t, h, w in grids), PATCH_DIM, generator=g)
            out["video_second_per_grid"] = torch.tensor([2.0 / fps for _, fps in self.videos])
            out["use_audio_in_video"] = self.use_audio_in_video
        return out


class Builder:
    """Append turns/parts; records the media spans as our processor would describe them."""

    def __init__(self, name: str, tokens: TokenIds, use_audio_in_video: bool = False):
        self.t = tokens
        self.case = Case(name, use_audio_in_video=use_audio_in_video)

    def text(self, *ids: int) -> Builder:
        self.case.ids += list(ids)
        return self

    def turn(self, role_token: int, *parts) -> Builder:
        self.text(self.t.im_start, role_token, NEWLINE)
        for part in parts:
            part(self) if callable(part) else self.text(*part)
        return self.text(self.t.im_end, NEWLINE)

    def generation_prompt(self) -> Case:
        self.text(self.t.im_start, self.t.assistant, NEWLINE)
        return self.case

    def audio(self, frames: int) -> Builder:
        n = int(_get_feat_extract_output_lengths(torch.tensor(frames)))
        self.case.spans.append(MediaSpan(AUDIO, len(self.case.ids), num_audio=n))
        self.case.audio_frames.append(frames)
        return self.text(self.t.audio_start, *[self.t.audio_pad] * n, self.t.audio_end)

    def image(self, gh: int, gw: int) -> Builder:
        grid = (1, gh // MERGE, gw // MERGE)
        self.case.spans.append(MediaSpan(IMAGE, len(self.case.ids), grid=grid))
        self.case.images.append((1, gh, gw))
        n = grid[1] * grid[2]
        return self.text(self.t.vision_start, *[self.t.image_pad] * n, self.t.vision_end)

    def video(self, gt: int, gh: int, gw: int, fps: float, audio_frames: int | None = None) -> Builder:
        grid = (gt, gh // MERGE, gw // MERGE)
        self.case.videos.append(((gt, gh, gw), fps))
        start = len(self.case.ids)
        if audio_frames is None:
            self.case.spans.append(MediaSpan(VIDEO, start, grid=grid, seconds_per_grid=2.0 / fps))
            return self.text(self.t.vision_start, *[self.t.video_pad] * (gt * grid[1] * grid[2]), self.t.vision_end)
        n = int(_get_feat_extract_output_lengths(torch.tensor(audio_frames)))
        self.case.audio_frames.append(audio_frames)
        self.case.spans.append(MediaSpan(AUDIO_IN_VIDEO, start, n, grid, 2.0 / fps))
        return self.text(self.t.vision_start, *self._hf_interleave(gt, gh, gw, fps, n), self.t.vision_end)

    def _hf_interleave(self, gt, gh, gw, fps, num_audio) -> list[int]:
        """HF's processor placeholder string for audio-in-video, mapped back to ids."""
        names = {"<A>": self.t.audio_pad, "<V>": self.t.video_pad, "<S>": self.t.audio_start, "<E>": self.t.audio_end}
        stub = SimpleNamespace(
            video_processor=SimpleNamespace(merge_size=MERGE),
            audio_bos_token="<S>",
            audio_eos_token="<E>",
            audio_token="<A>",
            video_token="<V>",
        )
        text = Qwen3OmniMoeProcessor.replace_video_with_audio_token(
            stub,
            {"video_grid_thw": [np.array([gt, gh, gw])], "video_second_per_grid": [2.0 / fps]},
            0,
            {"num_audio_tokens": [num_audio]},
            0,
            position_id_per_seconds=POS_PER_S,
        )
        return [names[text[i : i + 3]] for i in range(0, len(text), 3)]


def thinker_cases(t: TokenIds) -> list[Case]:
    """The eight prompt shapes of the acceptance list."""
    sys_turn = (t.system, (11, 22, 33, 44))
    q = (2000, 2001, 2002)

    def b(name, **kw):
        return Builder(name, t, **kw).turn(*sys_turn)

    return [
        b("text").turn(t.user, (400, 401, 402, 403)).generation_prompt(),
        b("audio").turn(t.user, lambda x: x.audio(250), q).generation_prompt(),
        b("image").turn(t.user, lambda x: x.image(4, 6), q).generation_prompt(),
        b("video").turn(t.user, lambda x: x.video(3, 4, 6, fps=2.0), q).generation_prompt(),
        b("audio_image").turn(t.user, lambda x: x.audio(180), lambda x: x.image(6, 4), q).generation_prompt(),
        b("image_audio_image")
        .turn(t.user, lambda x: x.image(4, 4), (77,), lambda x: x.audio(120), lambda x: x.image(2, 8), q)
        .generation_prompt(),
        b("multi_turn")
        .turn(t.user, lambda x: x.image(4, 4), q)
        .turn(t.assistant, (900, 901, 902))
        .turn(t.user, (3000, 3001))
        .generation_prompt(),
        b("audio_in_video", use_audio_in_video=True)
        .turn(t.user, lambda x: x.video(4, 4, 4, fps=1.0, audio_frames=300), q)
        .generation_prompt(),
    ]
