"""``Omni`` with audio / image / video inputs vs HF's thinker fed the same preprocessed media.

Decoding, mel and patch maths and the encoders are tested against HF in the media tests; this
checks the wiring: measured counts, prompt layout, encoder row order, scatter, DeepStack and
MRoPE end to end (greedy tokens identical over 24 steps).
"""

import base64
import io
from functools import cache

import pytest
import torch
from helpers.qwen3_omni import AUDIO, IMAGE, REQUESTS, checkpoint, hf_inputs, omni, wav_data_url

from omniwalk.errors import InvalidRequestError

STEPS = 24


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
    from helpers.qwen3_omni import checkpoint
    from PIL import Image

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
