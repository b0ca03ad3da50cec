"""Qwen2.5-Omni served as users run it: ``omniwalk serve --model <tiny Qwen2.5-Omni dir>`` in a
subprocess and the official ``openai`` client; answers equal ``Omni`` in process (greedy). Audio
out: the non-streaming answer and ``/v1/audio/speech`` are the offline (one-shot) token2wav
decode, the streamed one is ``Omni.stream``'s windowed decode (PCM16 of the same samples)."""

import base64
import io

import numpy as np
import openai
import pytest
import soundfile
import torch
from helpers.live_server import launch, png_data_url
from helpers.media_samples import encode_video
from helpers.qwen2_5_omni import AUDIO, IMAGE, checkpoint, omni
from helpers.qwen3_omni import wav_data_url

from omniwalk.serve.audio_format import pcm16_bytes

# sides no multiple of 28 (this family's merged patch) or 32 (the other family's): resized to 32s by the
# server and then to 28s by the engine, 37x50 would keep its grid with other pixels and 45x70 gain a column
# (video: 38x50 frames, even sides for yuv420p, would gain a row and two columns of merged patches)
ODD_SIZES = [(37, 50), (45, 70)]
SPEECH = {
    "talker_temperature": 0.0,
    "min_audio_frames": 30,
    "max_audio_frames": 30,
    "seed": 5,
    "token2wav_num_steps": 3,
}

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def client():
    proc, base = launch(model=checkpoint("tiny"))
    try:
        yield openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_models_lists_the_family_name_voices_and_rate(client):
    (model,) = client.models.list().data
    assert model.id == "qwen2.5-omni"
    assert model.voices == ["chelsie", "ethan"] and model.sample_rate == 24000  # spk_dict.pt's speakers


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


def _greedy_media_chat(client, part: dict):
    """The server's answer and ``Omni``'s (in process, from the same bytes) to one media part + a question."""
    messages = [{"role": "user", "content": [part, {"type": "text", "text": "what is it"}]}]
    r = client.chat.completions.create(
        model="qwen2.5-omni",
        messages=messages,
        max_tokens=8,
        temperature=0.0,
        logprobs=True,
        extra_body={"ignore_eos": True},
    )
    ref = omni().generate(
        {"messages": messages, "max_tokens": 8, "temperature": 0.0, "ignore_eos": True, "logprobs": True}
    )
    return r, ref


def _assert_same_answer(r, ref) -> None:
    assert r.usage.prompt_tokens == len(ref.prompt_token_ids) and r.choices[0].message.content == ref.text
    assert [t.logprob for t in r.choices[0].logprobs.content] == [p.logprob for p in ref.logprobs]


@pytest.mark.parametrize("size", ODD_SIZES)
def test_image_resized_once_equals_omni_in_process(client, size):
    image = np.random.default_rng(size[0]).integers(0, 256, (*size, 3), dtype=np.uint8)
    _assert_same_answer(*_greedy_media_chat(client, {"type": "image_url", "image_url": {"url": png_data_url(image)}}))


def test_video_resized_once_equals_omni_in_process(client):
    pytest.importorskip("av", reason="PyAV encodes the test video")
    frames = np.random.default_rng(3).integers(0, 256, (4, 38, 50, 3), dtype=np.uint8)
    url = "data:video/mp4;base64," + base64.b64encode(encode_video(frames, 2)).decode()
    _assert_same_answer(*_greedy_media_chat(client, {"type": "video_url", "video_url": {"url": url}}))


def test_streamed_text_equals_the_whole_answer(client):
    messages = [{"role": "user", "content": "tell me a story"}]
    kw = {"model": "qwen2.5-omni", "messages": messages, "max_tokens": 10, "temperature": 0.0}
    whole = client.chat.completions.create(**kw, extra_body={"ignore_eos": True}).choices[0].message.content
    chunks = client.chat.completions.create(**kw, stream=True, extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole


def _speech_request(stream: bool = False) -> dict:
    messages = [{"role": "user", "content": "tell me a story"}]
    return {
        "messages": messages,
        "max_tokens": 5,
        "temperature": 0.0,
        "ignore_eos": True,
        "modalities": ["text", "audio"],
        "voice": "Ethan",
        "stream": stream,
        **SPEECH,
    }


def test_chat_audio_out_is_the_offline_decode(client):
    r = client.chat.completions.create(
        model="qwen2.5-omni",
        messages=_speech_request()["messages"],
        max_tokens=5,
        temperature=0.0,
        modalities=["text", "audio"],
        audio={"voice": "ETHAN", "format": "wav"},
        extra_body={"ignore_eos": True, **SPEECH},
    )
    message, ref = r.choices[0].message, omni().generate(_speech_request())
    samples, rate = soundfile.read(io.BytesIO(base64.b64decode(message.audio.data)), dtype="float32")
    assert rate == 24000 and len(samples) == len(ref.audio) == 30 * 480
    assert np.abs(samples - ref.audio.numpy()).max() <= 1.5 / 32767  # (PCM16 of the same samples)
    assert message.content is None and message.audio.transcript == ref.text


def test_streamed_chat_audio_is_the_windowed_decode(client):
    stream = client.chat.completions.create(
        model="qwen2.5-omni",
        messages=_speech_request()["messages"],
        max_tokens=5,
        temperature=0.0,
        stream=True,
        modalities=["text", "audio"],
        audio={"voice": "ethan", "format": "pcm16"},
        extra_body={"ignore_eos": True, **SPEECH},
    )
    pcm = [
        base64.b64decode(getattr(choice.delta.audio, "data", None) or "")
        for chunk in stream
        for choice in chunk.choices
        if getattr(choice.delta, "audio", None)
    ]
    events = [e.data for e in omni().stream(_speech_request()) if e.kind == "audio"]
    assert len(events) >= 1 and b"".join(pcm) == pcm16_bytes(torch.cat(events).numpy())


def test_audio_speech_endpoint(client):
    r = client.audio.speech.create(
        model="qwen2.5-omni", input="good morning", voice="chelsie", response_format="flac", extra_body=SPEECH
    )
    samples, rate = soundfile.read(io.BytesIO(r.content))
    assert rate == 24000 and len(samples) == 30 * 480


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"audio": {"voice": "nobody", "format": "wav"}}, "audio.voice"),
        ({"extra_body": {"token2wav_num_steps": 1}}, None),
        ({"extra_body": {"token2wav_num_steps": "many"}}, None),
    ],
)
def test_bad_voice_and_fields_are_400(client, extra, param):
    kw = {"audio": {"voice": "ethan", "format": "wav"}, **extra}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="qwen2.5-omni", messages=[{"role": "user", "content": "hi"}], modalities=["text", "audio"], **kw
        )
    assert e.value.status_code == 400 and e.value.body["type"] == "invalid_request_error"
    assert param is None or e.value.body["param"] == param
