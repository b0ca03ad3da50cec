"""Prompt ids and MRoPE positions equal HF's chat template + ``Qwen3OmniMoeProcessor``.

HF's processor is built around a make-tiny checkpoint's tokenizer and chat template. Its
video processor needs torchvision (absent here), so a stand-in returns the grid of frames that
are already multiples of 32 pixels (no resize); everything else is HF's own code.
Media are measured from HF's outputs: this tests layout and expansion, not resize / mel maths.
"""

from functools import cache

import numpy as np
import pytest
import torch
from hf_oracle import hf_model, whisper_extractor
from transformers import AutoTokenizer, Qwen3OmniMoeProcessor
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import _get_feat_extract_output_lengths

from omniwalk.errors import InvalidRequestError
from omniwalk.models.common.processing.chat import ChatProcessor, MediaItem
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

    from hf_oracle import TEST_ROOT

    return make_tiny_checkpoint(tempfile.mkdtemp(prefix=tmp, dir=TEST_ROOT))


@cache
def hf_processor():
    tok = AutoTokenizer.from_pretrained(checkpoint(), extra_special_tokens=HF_TOKEN_NAMES)
    p = object.__new__(Qwen3OmniMoeProcessor)  # skips the class checks that want torchvision
    p.tokenizer, p.chat_template, p.video_processor = tok, tok.chat_template, GridOnlyVideoProcessor()
    p.feature_extractor = whisper_extractor()
    p.image_processor = Qwen2VLImageProcessorPil(
        patch_size=16,
        temporal_patch_size=2,
        merge_size=2,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
        size={"shortest_edge": 3136, "longest_edge": 12845056},
    )
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
