"""MRoPE positions and decode offsets equal HF's ``get_rope_index`` on every prompt shape."""

import pytest
import torch
from helpers.hf_oracle import hf_model
from helpers.processor_oracle import Builder, thinker_cases

from omniwalk.layers.rotary import mrope_cos_sin
from omniwalk.models.common.processing.positions import (
    RopePositions,
    batch_spans,
    interleave_audio_video,
    mrope_positions,
    video_times,
)
from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig

CFG = Qwen3OmniConfig.from_hf(hf_model("tiny").config.to_dict())
CASES = thinker_cases(CFG.tokens)


def hf_rope_index(case):
    inputs = case.hf_inputs()
    mask = inputs.get("feature_attention_mask")
    return hf_model("tiny").thinker.get_rope_index(
        inputs["input_ids"],
        image_grid_thw=inputs.get("image_grid_thw"),
        video_grid_thw=inputs.get("video_grid_thw"),
        attention_mask=inputs["attention_mask"],
        use_audio_in_video=case.use_audio_in_video,
        audio_seqlens=None if mask is None else mask.sum(-1),
        second_per_grids=inputs.get("video_second_per_grid"),
    )


def _extra_cases():
    t = CFG.tokens
    # The video ends before a short audio: HF continues the end sentinels from the audio block's
    # max although the video's H/W rows went higher; and two videos with their audio tracks.
    return [
        Builder("audio_outlasts_video", t, use_audio_in_video=True)
        .turn(t.user, lambda x: x.video(2, 12, 12, fps=26.0, audio_frames=30), (5, 6))
        .generation_prompt(),
        Builder("two_videos_with_audio", t, use_audio_in_video=True)
        .turn(
            t.user,
            lambda x: x.video(2, 4, 4, fps=0.5, audio_frames=420),
            lambda x: x.video(2, 2, 2, fps=4.0, audio_frames=50),
        )
        .generation_prompt(),
    ]


@pytest.mark.parametrize("case", CASES + _extra_cases(), ids=lambda c: c.name)
def test_positions_and_delta_equal_hf(case):
    expected, delta = hf_rope_index(case)
    ours = mrope_positions(len(case.ids), case.spans, CFG.position_id_per_seconds)
    assert torch.equal(ours.positions, expected[:, 0].float())
    assert ours.delta == float(delta)
    # decode: HF uses cache position + delta on all three rows
    for step in range(3):
        index = len(case.ids) + step
        assert torch.equal(ours.decode(index), torch.full((3, 1), float(index + delta.item())))


def test_interleave_matches_video_time_order():
    times = video_times((3, 1, 2), 2.0, 13)  # frames at 0, 26, 52; two tokens each
    order = interleave_audio_video(times, 30)
    assert order[:2] == [True, True] and order[2:28] == [False] * 26 and order[28:30] == [True, True]
    assert sum(order) == 6 and len(order) == 36


def test_mrope_cos_sin_uses_interleaved_axes():
    section = CFG.text.rope.mrope_section
    d = CFG.text.head_dim
    pos = torch.stack([torch.full((2,), 5.0), torch.full((2,), 7.0), torch.full((2,), 9.0)])
    cos, _ = mrope_cos_sin(pos, d, 1e6, section)
    inv = 1.0 / 1e6 ** (torch.arange(0, d, 2).float() / d)
    for slot in range(d // 2):
        axis = 1 if slot % 3 == 1 and slot < 3 * section[1] else 2 if slot % 3 == 2 and slot < 3 * section[2] else 0
        assert torch.allclose(cos[0, slot], torch.cos(pos[axis, 0] * inv[slot]))
        assert torch.allclose(cos[0, slot + d // 2], cos[0, slot])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(7, 4, 16), (2, 5, 3, 8)])
def test_rotary_tables_give_the_textbook_rotation_bit_for_bit(dtype, shape):
    """``apply_rotary`` with shared tables (sin's first half negated, both rounded once) equals
    HF's ``x * cos + rotate_half(x) * sin`` with cos/sin rounded to x's dtype, exactly."""
    from omniwalk.layers.rotary import apply_rotary, rotary_tables

    g = torch.Generator().manual_seed(0)
    x = (torch.randn(*shape, generator=g) * 3).to(dtype)
    angles = torch.randn(*shape[:-2], shape[-1] // 2, generator=g) * 10
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    half = shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    expected = x * cos.unsqueeze(-2).to(dtype) + rotated * sin.unsqueeze(-2).to(dtype)
    assert torch.equal(apply_rotary(x, *rotary_tables(cos, sin, dtype)), expected)


@pytest.mark.parametrize(
    "spans",
    [
        [(0, 10, 1), (1, 7, 1)],  # decode rows only
        [(0, 4, 6), (1, 5, 1), (0, 12, 1)],  # a prefill chunk crossing the prompt's end, then decodes
        [(0, 0, 12)],  # a whole prompt and beyond
        [(1, 3, 4), (0, 2, 3)],  # prompt rows only
    ],
)
def test_batch_spans_equal_the_spans_one_by_one(spans):
    ropes = [
        RopePositions(torch.arange(30.0).reshape(3, 10), 3.0),
        RopePositions(2 * torch.arange(15.0).reshape(3, 5), -1.0),
    ]
    items = [(ropes[r], start, n) for r, start, n in spans]
    got = batch_spans(items)
    assert torch.equal(got, torch.cat([rope.span(start, n) for rope, start, n in items], 1)) and got.is_contiguous()
