"""Realtime clients on their defaults against a live tiny server: the OpenAI Agents SDK's
``RealtimeAgent`` (voice ``ash``, ``semantic_vad``, OpenAI's model in the URL) answers a text turn
and runs a function tool; a pipecat-style handshake (``?model=gpt-realtime-...``); a
``session.update`` whose invalid fields are refused alone while the rest applies.

Random weights: the tool call is the grammar's doing (``tool_choice`` "required"); the tool itself
sets ``tool_choice`` back to "auto" (as the Agents SDK's ``reset_tool_choice`` does for text
agents), so the turn after its output answers instead of calling again.
"""

import asyncio
import json
from typing import Annotated

import pydantic
import pytest
import websockets
from agents import function_tool
from agents.realtime import RealtimeAgent, RealtimeRunner
from agents.realtime.model_inputs import RealtimeModelSendRawMessage
from helpers.live_server import server

from omniwalk.serve.realtime import protocol as p
from omniwalk.serve.realtime.turn_detection import EAGERNESS_SILENCE_MS, TurnDetection, turn_detection
from omniwalk.serve.realtime.vad import VADParams

PIPECAT_MODEL = "gpt-realtime-2025-08-28"


@pytest.fixture(scope="module")
def base_url():
    with server("--max-audio-frames-limit", "12") as base:
        yield base


def ws_url(base_url: str, query: str = "") -> str:
    return base_url.replace("http", "ws", 1) + "/v1/realtime" + query


def session_update(**fields) -> RealtimeModelSendRawMessage:
    """A partial ``session.update`` sent as it is (the SDK's own would send the whole session)."""
    return RealtimeModelSendRawMessage(
        message={"type": "session.update", "other_data": {"session": {"type": "realtime", **fields}}}
    )


async def agent_turns(base_url: str) -> tuple[list, list, list]:
    """A text turn, then a turn that calls a tool: the session's events of each, and the tool's calls."""
    calls, state = [], {}

    @function_tool
    async def get_weather(city: Annotated[str, pydantic.Field(max_length=8)]) -> str:
        """The weather in a city."""
        calls.append(city)
        await state["session"].model.send_event(session_update(tool_choice="auto", max_output_tokens=8))
        return "sunny, 24 C"

    agent = RealtimeAgent(name="forecaster", instructions="Answer briefly.", tools=[get_weather])
    settings = {"max_output_tokens": 8, "temperature": 0.0}  # (voice, turn detection: the SDK's defaults)
    config = {"url": ws_url(base_url, "?model=gpt-realtime"), "api_key": "unused", "initial_model_settings": settings}
    async with await RealtimeRunner(agent).run(model_config=config) as session:
        state["session"] = session
        text_turn = await turn(session, "Hello there")
        await session.model.send_event(session_update(tool_choice="required", max_output_tokens=48))
        tool_turn = await turn(session, "Is it warm in Paris?", responses=2)  # (the call, then the answer)
    return text_turn, tool_turn, calls


async def turn(session, text: str, responses: int = 1, timeout: float = 180) -> list:
    """The session's events from sending ``text`` to the end of its ``responses``-th response (an
    ``agent_end`` each: a tool turn's call, then its answer; the tool may end before or after the call's
    response is done, so counting responses, not waiting for ``tool_end``, finds the answer's end)."""
    await session.send_message(text)
    events = []

    async def read():
        ended = 0
        async for event in session:
            events.append(event)
            ended += event.type == "agent_end"
            if ended == responses:
                return

    await asyncio.wait_for(read(), timeout)
    return events


def server_events(events: list, kind: str) -> list[dict]:
    """The server's events of type ``kind`` among an SDK session's events."""
    raw = [e.data.data for e in events if e.type == "raw_model_event" and e.data.type == "raw_server_event"]
    return [event for event in raw if event.get("type") == kind]


def test_the_agents_sdk_realtime_agent_on_its_defaults(base_url):
    text_turn, tool_turn, calls = asyncio.run(agent_turns(base_url))
    for events in (text_turn, tool_turn):
        assert not [e for e in events if e.type == "error"], [e.error for e in events if e.type == "error"]
        assert "audio" in [e.type for e in events]  # (the SDK's default modalities: audio)
    first = server_events(text_turn, "session.updated")[0]["session"]["audio"]  # (the SDK's defaults)
    assert first["output"]["voice"] == "ash" and first["input"]["turn_detection"]["type"] == "semantic_vad"
    assert len(calls) == 1 and isinstance(calls[0], str)
    kinds = [e.type for e in tool_turn]
    assert kinds.index("tool_start") < kinds.index("tool_end") < max(i for i, k in enumerate(kinds) if k == "audio")
    assert kinds[-1] == "agent_end"


async def pipecat_session(base_url: str) -> list[dict]:
    async with websockets.connect(ws_url(base_url, f"?model={PIPECAT_MODEL}")) as ws:
        events = [json.loads(await ws.recv())]
        session = {
            "type": "realtime",
            "model": PIPECAT_MODEL,
            "instructions": "Be brief.",
            "audio": {
                "input": {"turn_detection": {"type": "semantic_vad", "eagerness": "high"}},
                "output": {"voice": "alloy"},
            },
        }
        await ws.send(json.dumps({"type": "session.update", "session": session}))
        events.append(json.loads(await ws.recv()))
        return events


def test_a_pipecat_style_handshake_and_openais_defaults(base_url):
    created, updated = asyncio.run(pipecat_session(base_url))
    assert created["type"] == "session.created" and created["session"]["model"] == "qwen3-omni"
    assert updated["type"] == "session.updated", updated  # (no error event: pipecat stops at one)
    audio = updated["session"]["audio"]
    assert audio["input"]["turn_detection"] == {
        "type": "semantic_vad",
        "eagerness": "high",
        "create_response": True,
        "interrupt_response": True,
        "preemptive_silence_ms": 200,  # (omniwalk's: the server's default)
    }
    assert audio["output"]["voice"] == "alloy" and updated["session"]["instructions"] == "Be brief."


async def partial_update(base_url: str, session: dict) -> list[dict]:
    async with websockets.connect(ws_url(base_url)) as ws:
        await ws.recv()
        await ws.send(json.dumps({"type": "session.update", "event_id": "evt_1", "session": session}))
        events = []
        while not events or events[-1]["type"] != "session.updated":
            events.append(json.loads(await ws.recv()))
        return events


def test_an_invalid_field_is_refused_alone_and_the_rest_applies(base_url):
    session = {
        "instructions": "Speak like a pirate.",
        "audio": {"output": {"voice": "nobody"}, "input": {"noise_reduction": {"type": "near_field"}}},
        "temperature": "hot",
        "max_output_tokens": 7,
        "output_modalities": ["text"],
        "tools": [{"type": "mcp", "server_label": "x"}],
    }
    *errors, updated = asyncio.run(partial_update(base_url, session))
    params = sorted(e["error"]["param"] for e in errors)
    assert params == [
        "session.audio.input.noise_reduction",
        "session.audio.output.voice",
        "session.temperature",
        "session.tools[0].type",
    ]
    assert all(e["type"] == "error" and e["error"]["event_id"] == "evt_1" for e in errors)
    applied = updated["session"]
    assert applied["instructions"] == "Speak like a pirate." and applied["max_output_tokens"] == 7
    assert applied["output_modalities"] == ["text"] and applied["audio"]["output"]["voice"] is None
    assert "temperature" not in applied and applied["tools"] == []


VAD = VADParams(threshold=0.4, prefix_padding_ms=200, silence_ms=700)


def test_semantic_vad_eagerness_picks_the_silence():
    for eagerness, silence_ms in EAGERNESS_SILENCE_MS.items():
        td = turn_detection(p.TurnDetection(type="semantic_vad", eagerness=eagerness), None, VAD, "td")
        assert td.vad == VADParams(threshold=0.4, prefix_padding_ms=200, silence_ms=silence_ms)
        assert td.to_json()["type"] == "semantic_vad" and td.to_json()["eagerness"] == eagerness
    assert turn_detection(p.TurnDetection(type="semantic_vad"), None, VAD, "td").eagerness == "auto"
    assert EAGERNESS_SILENCE_MS["low"] > EAGERNESS_SILENCE_MS["medium"] > EAGERNESS_SILENCE_MS["high"]
    semantic = turn_detection(p.TurnDetection(type="semantic_vad", eagerness="low"), None, VAD, "td")
    back = turn_detection(p.TurnDetection(type="server_vad"), semantic, VAD, "td")
    assert back.vad == VAD and back.to_json()["silence_duration_ms"] == 700  # (server_vad's own, not low's)
    server_vad = TurnDetection(VADParams(silence_ms=300))
    kept = turn_detection(p.TurnDetection(type="server_vad", threshold=0.9), server_vad, VAD, "td")
    assert kept.vad.silence_ms == 300 and kept.vad.threshold == 0.9
    with pytest.raises(Exception, match="semantic_vad has no silence_duration_ms") as e:
        turn_detection(p.TurnDetection(type="semantic_vad", silence_duration_ms=300), None, VAD, "td")
    assert e.value.param == "td.silence_duration_ms"
