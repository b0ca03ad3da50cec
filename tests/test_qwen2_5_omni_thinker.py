"""Qwen2.5-Omni through ``Omni`` vs HF transformers' ``Qwen2_5OmniForConditionalGeneration`` thinker
(the oracle), on two tiny configs: greedy ids identical over 32+ steps for text, audio, image,
video and audio-in-video prompts, logprobs within 1e-4 (fp32 on the CPU)."""

import tempfile
from functools import cache

import numpy as np
import pytest
import torch
from hf_oracle import TEST_ROOT
from qwen2_5_oracle import config_dict

from omniwalk import Omni
from omniwalk.media.mel import log_mel
from omniwalk.models.qwen2_5_omni.checkpoint.tiny import make_tiny_checkpoint
from omniwalk.models.qwen2_5_omni.processing.chat import DEFAULT_SYSTEM_PROMPT
from omniwalk.models.qwen2_5_omni.processing.media_inputs import vision_pixels

STEPS = 32
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
    ),  # fmt: skip
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


@pytest.mark.parametrize("case", list(REQUESTS))
@pytest.mark.parametrize("name", ["tiny", "uneven"])
@torch.no_grad()
def test_greedy_thinker_matches_hf(name, case):
    request = {**REQUESTS[case], "max_tokens": STEPS, "min_tokens": STEPS, "temperature": 0.0, "logprobs": True}
    aiv = bool(request.get("use_audio_in_video"))
    prompt = omni(name).family.prompt(request)
    out = omni(name).generate(request)
    gen = hf(name).thinker.generate(
        **hf_inputs(prompt, aiv), max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False,
        output_logits=True, return_dict_in_generate=True,
    )  # fmt: skip
    assert out.prompt_token_ids == prompt.token_ids
    assert out.token_ids == gen.sequences[0, len(prompt.token_ids) :].tolist()
    hf_logprobs = [
        torch.log_softmax(step[0].float(), -1)[t].item() for step, t in zip(gen.logits, out.token_ids, strict=True)
    ]
    ours = [p.logprob for p in out.logprobs]
    assert max(abs(a - b) for a, b in zip(ours, hf_logprobs, strict=True)) < 1e-4


def test_text_prompt_is_hf_chat_template():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(checkpoint("tiny"))
    full = [{"role": "system", "content": DEFAULT_SYSTEM_PROMPT}, *MESSAGES]
    ids = tok.apply_chat_template(full, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert omni().family.prompt({"messages": MESSAGES}).token_ids == list(ids)


@pytest.mark.parametrize("case", ["image", "video", "image_audio_image", "audio_in_video"])
def test_tmrope_positions_equal_hf_get_rope_index(case):
    request = REQUESTS[case]
    aiv = bool(request.get("use_audio_in_video"))
    prompt = omni("uneven").family.prompt(request)
    inputs = hf_inputs(prompt, aiv)
    audio_lengths = inputs["feature_attention_mask"].sum(-1) if "feature_attention_mask" in inputs else None
    positions, delta = hf("uneven").thinker.model.get_rope_index(
        inputs["input_ids"], inputs.get("image_grid_thw"), inputs.get("video_grid_thw"), inputs["attention_mask"],
        aiv, audio_lengths, inputs.get("video_second_per_grid"),
    )  # fmt: skip
    assert torch.equal(prompt.rope.positions, positions[:, 0].float())
    assert prompt.rope.delta == float(delta)


def test_audio_longer_than_the_processors_300_s_is_cut_as_hf_cuts_it():
    from transformers import WhisperFeatureExtractor

    from omniwalk.models.common.processing.chat import MediaPart
    from omniwalk.models.qwen2_5_omni.processing.media_inputs import measure

    long = np.zeros(301 * 16000 + 5, dtype=np.float32)
    item = measure(MediaPart("audio", {"type": "audio", "audio": long}))
    extractor = WhisperFeatureExtractor(feature_size=128, chunk_length=300, n_samples=4_800_000, nb_max_frames=30000)
    frames = extractor([long], sampling_rate=16000, padding="max_length", return_attention_mask=True)["attention_mask"]
    assert len(item.data["audio"]) == 300 * 16000 and item.num_audio_tokens == ((frames.sum() - 1) // 2 - 1) // 2 + 1
