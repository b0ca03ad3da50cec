"""Hand-built thinker prompts (ids + media spans + the matching HF model inputs), for parity tests.

Placeholder runs are expanded with HF's own formulas (audio token count from
``_get_feat_extract_output_lengths``; audio-in-video order from the HF processor's
``replace_video_with_audio_token``), so the ids are an oracle independent of our processor.
Media tensors are random (random log-mel frames, random flattened patches): the thinker's
parity does not depend on them looking like real media.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import torch
from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import (
    Qwen3OmniMoeProcessor,
    _get_feat_extract_output_lengths,
)

from omniwalk.models.common.checkpoint.config import TokenIds
from omniwalk.models.common.processing.positions import AUDIO, AUDIO_IN_VIDEO, IMAGE, VIDEO, MediaSpan

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
