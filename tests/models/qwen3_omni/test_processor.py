"""Prompt ids and MRoPE positions equal HF's chat template + ``Qwen3OmniMoeProcessor``.

HF's processor is built around a make-tiny checkpoint's tokenizer and chat template. Its
video processor needs torchvision (absent here), so a stand-in returns the grid of frames that
are already multiples of 32 pixels (no resize); everything else is HF's own code.
Media are measured from HF's outputs: this tests layout and expansion, not resize / mel maths.
"""

import pytest
import torch
from helpers.hf_oracle import hf_model
from helpers.processor_oracle import CASES, hf_call, ours, user
from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import _get_feat_extract_output_lengths

from omniwalk.errors import InvalidRequestError
from omniwalk.models.common.processing.chat import MediaItem


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
