"""Prompt ids and MRoPE positions equal HF's chat template + ``Qwen3OmniMoeProcessor``.

HF's processor is built around a make-tiny checkpoint's tokenizer and chat template. Its
video processor needs torchvision (absent here), so a stand-in returns the grid of frames that
are already multiples of 32 pixels (no resize); everything else is HF's own code.
Media are measured from HF's outputs: this tests layout and expansion, not resize / mel maths.

MRoPE positions and decode offsets equal HF's ``get_rope_index`` on every prompt shape."""

import pytest
import torch
from helpers.hf_oracle import hf_model
from helpers.processor_oracle import CASES, Builder, hf_call, ours, thinker_cases, user
from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import _get_feat_extract_output_lengths

from omniwalk.errors import InvalidRequestError
from omniwalk.layers.rotary import mrope_cos_sin
from omniwalk.models.common.processing.chat import MediaItem
from omniwalk.models.common.processing.positions import (
    RopePositions,
    batch_spans,
    interleave_audio_video,
    mrope_positions,
    video_times,
)
from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig


def measured_items(messages, out, use_audio_in_video):
    """Our MediaItems in content order, measured from HF's processor outputs."""
    audio_tokens = iter(
        []
        if "feature_attention_mask" not in out
        else _get_feat_extract_output_lengths(out["feature_attention_mask"].sum(-1)).tolist()
    )
    image_grids = iter(out.get("image_grid_thw", torch.zeros(0, 3)).tolist())
    video_grids = iter(out.get("video_grid_thw", torch.zeros(0, 3)).tolist())
    items = []
    for part in (p for m in messages if isinstance(m["content"], list) for p in m["content"] if p["type"] != "text"):
        if part["type"] == "audio":
            items.append(MediaItem("audio", num_audio_tokens=next(audio_tokens)))
        elif part["type"] == "image":
            items.append(MediaItem("image", grid_thw=tuple(next(image_grids))))
        else:
            n = next(audio_tokens) if use_audio_in_video else 0
            items.append(MediaItem("video", n, tuple(next(video_grids)), 2.0 / part["fps"]))
    return items


@pytest.mark.parametrize("name", list(CASES))
def test_prompt_ids_and_positions_equal_hf(name):
    messages, aiv = CASES[name], name == "audio_in_video"
    out = hf_call(messages, aiv)
    ids, media = ours().tokenize(messages)
    assert [m.kind for m in media] == [m.kind for m in measured_items(messages, out, aiv)]
    prompt = ours().build(ids, measured_items(messages, out, aiv), use_audio_in_video=aiv)
    assert prompt.token_ids == out["input_ids"][0].tolist()

    mask = out.get("feature_attention_mask")
    expected, delta = hf_model("tiny").thinker.get_rope_index(
        out["input_ids"],
        out.get("image_grid_thw"),
        out.get("video_grid_thw"),
        out["attention_mask"],
        aiv,
        None if mask is None else mask.sum(-1),
        out.get("video_second_per_grid"),
    )
    assert torch.equal(prompt.rope.positions, expected[:, 0].float())
    assert prompt.rope.delta == float(delta)


def test_opting_out_of_the_default_system_prompt():
    with_default, _ = ours().tokenize(CASES["text"])
    without, _ = ours().tokenize(CASES["text"], use_default_system_prompt=False)
    own, _ = ours().tokenize([{"role": "system", "content": "Be brief."}, *CASES["text"]])
    t = ours().cfg.tokens
    assert without[:2] == [t.im_start, t.user] and with_default[:2] == [t.im_start, t.system]
    assert ours().tokenizer.decode(own, skip_special_tokens=False).startswith("<|im_start|>system\nBe brief.<|im_end|>")


def test_unknown_content_type_is_a_typed_error():
    with pytest.raises(InvalidRequestError, match=r"messages\[0\].content\[1\]: unknown content type 'file'"):
        ours().tokenize([user("hi", {"type": "file", "file": "x"})])
    with pytest.raises(InvalidRequestError, match="role"):
        ours().tokenize([{"role": "robot", "content": "hi"}])


def test_placeholder_media_count_mismatch_is_a_typed_error():
    ids, _ = ours().tokenize(CASES["audio_image"])
    with pytest.raises(InvalidRequestError, match="placeholder/media mismatch"):
        ours().build(ids, [MediaItem("audio", num_audio_tokens=5)])


def test_template_without_sentinels_is_rejected():
    t = ours().cfg.tokens
    with pytest.raises(InvalidRequestError, match="start/end tokens"):
        ours().build([t.im_start, t.audio_pad, t.im_end], [MediaItem("audio", num_audio_tokens=3)])


def test_chat_template_exceptions_are_typed():
    from omniwalk.models.common.processing.chat import render_chat

    with pytest.raises(InvalidRequestError, match="chat template: no"):
        render_chat("{{ raise_exception('no') }}", [])


CFG = Qwen3OmniConfig.from_hf(hf_model("tiny").config.to_dict())
MROPE_CASES = thinker_cases(CFG.tokens)


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
        # a voice conversation (text and audio alone: positions made at once, not span by span)
        Builder("voice_turns", t)
        .turn(t.user, lambda x: x.audio(250), (5, 6))
        .turn(t.assistant, (7, 8, 9))
        .turn(t.user, lambda x: x.audio(120))
        .generation_prompt(),
        Builder("two_videos_with_audio", t, use_audio_in_video=True)
        .turn(
            t.user,
            lambda x: x.video(2, 4, 4, fps=0.5, audio_frames=420),
            lambda x: x.video(2, 2, 2, fps=4.0, audio_frames=50),
        )
        .generation_prompt(),
    ]


@pytest.mark.parametrize("case", MROPE_CASES + _extra_cases(), ids=lambda c: c.name)
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
