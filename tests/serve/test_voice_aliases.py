"""OpenAI's voice names (``alloy``, ``ash``, ...) served by the checkpoint's voices: the alias table,
and a live tiny server taking them in chat ``audio.voice``, ``/v1/audio/speech`` and a Realtime
session, speaking exactly as the voice they map to."""

import asyncio
import base64
import json

import openai
import pytest
import websockets
from helpers.live_server import launch

from omniwalk.errors import ConfigError
from omniwalk.serve.voice_aliases import DEFAULT_ALIASES, alias_table, check_voice_aliases

QWEN3_VOICES = ("aiden", "chelsie", "ethan")
FRAMES = {"talker_temperature": 0.0, "code_predictor_temperature": 0.0, "min_audio_frames": 6, "max_audio_frames": 6}
OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "sage", "shimmer", "verse", "marin", "cedar")


def test_every_openai_voice_has_a_default_for_both_families():
    for voices in (QWEN3_VOICES, ("chelsie", "ethan"), ("solo",)):
        table = alias_table((), voices)
        assert set(OPENAI_VOICES) <= set(table) and set(table.values()) <= set(voices)
    assert alias_table((), QWEN3_VOICES)["ash"] == "ethan" and alias_table((), QWEN3_VOICES)["coral"] == "chelsie"
    assert alias_table((), ("chelsie", "ethan"))["verse"] == "ethan"  # (aiden first where the checkpoint has it)
    assert alias_table((), ("solo",))["ash"] == "solo"  # no liked voice: the checkpoint's first
    assert alias_table((), ()) == {}  # a checkpoint that does not speak


def test_given_entries_override_the_defaults_and_are_checked():
    table = alias_table(("ash=chelsie", "Robot=Aiden"), QWEN3_VOICES)
    assert table["ash"] == "chelsie" and table["robot"] == "aiden" and table["echo"] == "ethan"
    assert set(table) == set(DEFAULT_ALIASES) | {"robot"}
    check_voice_aliases(("ash=chelsie",), QWEN3_VOICES)
    check_voice_aliases(("ash=nobody",), ())  # (no speech: nothing to check)
    with pytest.raises(ConfigError, match="has no voice 'nobody'"):
        check_voice_aliases(("ash=nobody",), QWEN3_VOICES)
    with pytest.raises(ConfigError, match="is a voice of the checkpoint"):
        check_voice_aliases(("ethan=chelsie",), QWEN3_VOICES)


def speech(client, voice: str) -> bytes:
    return client.audio.speech.create(
        model="qwen3-omni", input="good morning", voice=voice, response_format="pcm", extra_body=FRAMES
    ).content


def test_an_alias_speaks_as_its_voice_in_speech_and_chat(client):
    ethan, chelsie = speech(client, "ethan"), speech(client, "chelsie")
    assert speech(client, "ash") == ethan and speech(client, "coral") == chelsie and ethan != chelsie
    chat = lambda voice: client.chat.completions.create(  # noqa: E731
        model="qwen3-omni",
        messages=[{"role": "user", "content": "hi"}],
        modalities=["text", "audio"],
        audio={"voice": voice, "format": "pcm16"},
        max_tokens=3,
        temperature=0.0,
        extra_body=FRAMES,
    )
    assert chat("echo").choices[0].message.audio.data == chat("ethan").choices[0].message.audio.data
    for call in (lambda: speech(client, "nobody"), lambda: chat("nobody")):
        with pytest.raises(openai.BadRequestError) as e:
            call()
        assert e.value.body["param"] in ("voice", "audio.voice") and "ash" in e.value.body["message"]


async def realtime_audio(base_url: str, voice: str) -> tuple[dict, bytes]:
    async with websockets.connect(base_url.replace("http", "ws", 1) + "/v1/realtime", max_size=2**24) as ws:
        await ws.recv()  # session.created
        session = {"type": "realtime", "audio": {"input": {"turn_detection": None}, "output": {"voice": voice}}}
        await ws.send(json.dumps({"type": "session.update", "session": {**session, "temperature": 0.0, **FRAMES}}))
        updated = json.loads(await ws.recv())
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
        await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
        await ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": 3}}))
        audio = b""
        while (event := json.loads(await asyncio.wait_for(ws.recv(), 120)))["type"] != "response.done":
            if event["type"] == "response.output_audio.delta":
                audio += base64.b64decode(event["delta"])
        return updated, audio


def test_a_realtime_session_takes_an_alias(base_url):
    updated, ash = asyncio.run(realtime_audio(base_url, "ash"))
    assert updated["type"] == "session.updated" and updated["session"]["audio"]["output"]["voice"] == "ash"
    _, ethan = asyncio.run(realtime_audio(base_url, "ethan"))
    assert ash and ash == ethan


def test_an_alias_to_a_missing_voice_stops_the_server():
    with pytest.raises(AssertionError, match="voice alias ash=nobody: the checkpoint has no voice 'nobody'"):
        proc, _ = launch("--voice-alias", "ash=nobody")
        proc.terminate()
