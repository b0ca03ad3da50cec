"""Qwen2.5-Omni served as users run it: ``omniwalk serve --model <tiny Qwen2.5-Omni dir>`` in a
subprocess and the official ``openai`` client; answers equal ``Omni`` in process (greedy)."""

import openai
import pytest
from test_omni_media import wav_data_url
from test_qwen2_5_omni_thinker import AUDIO, IMAGE, checkpoint, omni
from test_server import launch, png_data_url

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def client():
    proc, base = launch(model=checkpoint("tiny"))
    try:
        yield openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_models_lists_the_family_name(client):
    assert [m.id for m in client.models.list().data] == ["qwen2.5-omni"]


def test_text_and_media_chat_equal_omni_in_process(client):
    content = [
        {"type": "input_audio", "input_audio": {"data": wav_data_url(AUDIO).split(",", 1)[1], "format": "wav"}},
        {"type": "image_url", "image_url": {"url": png_data_url(IMAGE)}},
        {"type": "text", "text": "what is it"},
    ]
    for messages in ([{"role": "user", "content": "hello world"}], [{"role": "user", "content": content}]):
        r = client.chat.completions.create(
            model="qwen2.5-omni", messages=messages, max_tokens=8, temperature=0.0, extra_body={"ignore_eos": True}
        )
        ref = omni().generate({"messages": messages, "max_tokens": 8, "temperature": 0.0, "ignore_eos": True})
        assert r.choices[0].message.content == ref.text and r.choices[0].finish_reason == "length"
        assert r.usage.prompt_tokens == len(ref.prompt_token_ids) and r.usage.completion_tokens == 8


def test_streamed_text_equals_the_whole_answer(client):
    messages = [{"role": "user", "content": "tell me a story"}]
    kw = {"model": "qwen2.5-omni", "messages": messages, "max_tokens": 10, "temperature": 0.0}
    whole = client.chat.completions.create(**kw, extra_body={"ignore_eos": True}).choices[0].message.content
    chunks = client.chat.completions.create(**kw, stream=True, extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole


def test_audio_out_is_refused_until_the_talker_serves(client):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="qwen2.5-omni",
            messages=[{"role": "user", "content": "hi"}],
            modalities=["text", "audio"],
            audio={"voice": "chelsie", "format": "wav"},
        )
