"""``Omni`` with audio / image / video inputs vs HF's thinker fed the same preprocessed media.

Decoding, mel and patch maths and the encoders are tested against HF in the media tests; this
checks the wiring: measured counts, prompt layout, encoder row order, scatter, DeepStack and
MRoPE end to end (greedy tokens identical over 24 steps).
"""

import base64
import io
import wave
from functools import cache

import numpy as np
import pytest
import torch
from test_omni_text import checkpoint, omni

from omniwalk.errors import InvalidRequestError
from omniwalk.media.mel import log_mel
from omniwalk.models.qwen3_omni.processing.media_inputs import vision_pixels

RNG = np.random.default_rng(1)
AUDIO = (0.1 * RNG.standard_normal(16000 * 2 + 300)).astype(np.float32)
IMAGE = RNG.integers(0, 256, (90, 130, 3), dtype=np.uint8)
VIDEO = RNG.integers(0, 256, (8, 64, 96, 3), dtype=np.uint8)
STEPS = 24


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


@cache
def hf(name: str):
    from transformers import Qwen3OmniMoeForConditionalGeneration

    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(checkpoint(name)).eval()


@pytest.mark.parametrize("case", list(REQUESTS))
@pytest.mark.parametrize("name", ["tiny", "uneven"])
@torch.no_grad()
def test_media_chat_matches_hf(name, case):
    request = {**REQUESTS[case], "max_tokens": STEPS, "min_tokens": STEPS, "temperature": 0.0}
    aiv = bool(request.get("use_audio_in_video"))
    prompt = omni(name).family.prompt(request)
    if aiv:
        t = omni(name).family.cfg.tokens
        assert t.audio_start in prompt.token_ids and prompt.token_ids.count(t.audio_pad) > 0
    out = omni(name).generate(request)
    inputs = hf_inputs(prompt, aiv)
    gen = hf(name).thinker.generate(**inputs, max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False)
    assert out.prompt_token_ids == prompt.token_ids
    assert out.token_ids == gen[0, len(prompt.token_ids) :].tolist()


def test_base64_audio_and_data_url_image_parts():
    from PIL import Image

    png = io.BytesIO()
    Image.fromarray(IMAGE).save(png, format="PNG")
    image_url = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    b64_wav = wav_data_url(AUDIO).split(",", 1)[1]
    in_memory = omni().family.prompt(REQUESTS["audio_image"])
    encoded = omni().family.prompt(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_audio", "input_audio": {"data": b64_wav, "format": "wav"}},
                        {"type": "image_url", "image_url": {"url": image_url}},
                        {"type": "text", "text": "what is it"},
                    ],
                }
            ]
        }
    )
    assert encoded.token_ids == in_memory.token_ids


def test_remote_urls_and_bad_base64_are_typed_errors():
    with pytest.raises(InvalidRequestError, match="data: URL"):
        omni().family.prompt(
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "https://example.com/x.png"}}],
                    }
                ]
            }
        )
    with pytest.raises(InvalidRequestError, match="base64"):
        omni().family.prompt(
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "input_audio", "input_audio": {"data": "***", "format": "wav"}}],
                    }
                ]
            }
        )


def test_local_image_path_when_the_operator_allows_a_directory(tmp_path):
    from PIL import Image
    from test_omni_text import checkpoint

    from omniwalk import Omni

    Image.fromarray(IMAGE).save(tmp_path / "cat.png")
    allowed = Omni(model=checkpoint("tiny"), local_media_dir=str(tmp_path))
    by_path = allowed.family.prompt(
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "cat.png"}]}]}
    )
    in_memory = omni().family.prompt({"messages": [{"role": "user", "content": [{"type": "image", "image": IMAGE}]}]})
    assert by_path.token_ids == in_memory.token_ids
    with pytest.raises(InvalidRequestError, match="local paths are not read"):
        omni().family.prompt(
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "cat.png"}]}]}
        )
