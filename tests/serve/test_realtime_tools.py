"""Function calling over /v1/realtime: the official `openai` SDK's realtime client against a live
`omniwalk serve` (tiny random-weight model, so every call that parses is the grammar's doing).

A turn with tool_choice "required" gives a function_call item whose arguments validate against the
tool's parameters (jsonschema) and equal the chat completion's tool call for the same conversation;
its function_call_output then leads to a spoken answer whose prompt is the chat completion's with
the assistant's tool_calls and the tool message (same text, same prompt tokens). Bad tools and
items get `error` events naming the field, and the session goes on.
"""

import asyncio
import base64
import json
import urllib.request

import jsonschema
import numpy as np
import openai
import pydantic
import pytest
import websockets
from helpers.live_server import server, until
from openai.types.beta.realtime.realtime_server_event import RealtimeServerEvent as BetaServerEvent
from openai.types.realtime import RealtimeServerEvent

from omniwalk.bench.workload import speech_like
from omniwalk.serve.errors import APIError
from omniwalk.serve.realtime import protocol as p
from omniwalk.serve.realtime.bounds import AudioBudget, ConversationLimits
from omniwalk.serve.realtime.conversation import (
    Conversation,
    FunctionCall,
    FunctionCallOutput,
    Message,
    Part,
    item_from_client,
)
from omniwalk.serve.realtime.response import Response
from omniwalk.serve.wire import Delta, Finished

GREEDY = {"temperature": 0.0, "talker_temperature": 0.0, "code_predictor_temperature": 0.0}
NO_VAD = {"type": "realtime", "audio": {"input": {"turn_detection": None}, "output": {"voice": "ethan"}}}
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "unit": {"enum": ["c", "f"]},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOL = {"type": "function", "name": "get_weather", "description": "The forecast for a city.", "parameters": WEATHER}
CHAT_TOOL = {"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}}
QUESTION = "What will the weather be in Paris?"
FRAMES = 12  # codec frames of the spoken answer
SAMPLES_PER_FRAME = 1920  # at 24 kHz; a stream's audio is 555 samples short of whole frames


@pytest.fixture(scope="module")
def base_url():
    with server() as base:
        yield base


def sdk(base_url) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)


def chat(base_url: str, messages: list, **extra) -> dict:
    body = {"messages": messages, "tools": [CHAT_TOOL], **GREEDY, **extra}
    request = urllib.request.Request(
        f"{base_url}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    return json.loads(urllib.request.urlopen(request, timeout=120).read())


def user_text(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


CALL_ORDER = [
    "response.created", "response.output_item.added", "conversation.item.added",
    "response.function_call_arguments.delta", "response.function_call_arguments.done", "response.output_item.done",
    "conversation.item.done", "response.done",
]  # fmt: skip


def test_a_function_calling_turn_then_a_spoken_answer(base_url):
    async def talk():
        async with sdk(base_url).realtime.connect(model="qwen3-omni") as conn:
            await conn.recv()
            session = {**NO_VAD, "tools": [TOOL], "tool_choice": "required", "parallel_tool_calls": False}
            await conn.session.update(session={**session, "max_output_tokens": 200, **GREEDY})
            updated = await until(conn, "session.updated")
            await conn.conversation.item.create(item=user_text(QUESTION))
            await conn.response.create()
            calling = await until(conn)
            call = calling[-1].response.output[-1]
            await conn.conversation.item.create(
                item={"type": "function_call_output", "call_id": call.call_id, "output": '{"temp_c": 21}'}
            )
            added = await until(conn, "conversation.item.done")
            answer = {"tool_choice": "none", "max_output_tokens": 5, "ignore_eos": True}
            await conn.response.create(response={**answer, "min_audio_frames": FRAMES, "max_audio_frames": FRAMES})
            return updated[-1], calling, added[-1], await until(conn)

    updated, calling, added, answering = asyncio.run(talk())
    assert updated.session.tools[0].name == "get_weather" and updated.session.tool_choice == "required"

    # the call: one function_call item (no message: nothing was said, no audio), streamed then done
    types = [e.type for e in calling]
    order = [t for i, t in enumerate(types) if not (t.endswith(".delta") and types[i - 1] == t)]
    assert order[order.index("response.created") :] == CALL_ORDER
    done = calling[-1].response
    assert done.status == "completed" and [item.type for item in done.output] == ["function_call"]
    call = done.output[0]
    assert call.status == "completed" and call.name == "get_weather" and call.call_id.startswith("call_")
    deltas = [e for e in calling if e.type == "response.function_call_arguments.delta"]
    assert all((e.call_id, e.item_id, e.output_index) == (call.call_id, call.id, 0) for e in deltas)
    args_done = next(e for e in calling if e.type == "response.function_call_arguments.done")
    assert "".join(e.delta for e in deltas) == args_done.arguments == call.arguments
    assert args_done.name == "get_weather" and args_done.call_id == call.call_id
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    items = [e.item for e in calling[types.index("response.created") :] if e.type.startswith("conversation.item")]
    assert [item.type for item in items] == ["function_call", "function_call"] and items[-1] == call
    assert done.usage.output_token_details.audio_tokens == 0
    assert not any(e.type == "response.output_audio.delta" for e in calling)
    # ... the chat completion's call for the same conversation
    question = [{"role": "user", "content": QUESTION}]
    want = chat(base_url, question, tool_choice="required", parallel_tool_calls=False, max_tokens=200)
    (tool_call,) = want["choices"][0]["message"]["tool_calls"]
    assert tool_call["function"] == {"name": "get_weather", "arguments": call.arguments}
    assert done.usage.input_tokens == want["usage"]["prompt_tokens"]

    # the output comes back as an item; the answer to it is spoken, its prompt the chat one with the tool turn
    assert added.item.type == "function_call_output" and added.item.call_id == call.call_id
    said = answering[-1].response
    assert said.status == "incomplete" and [item.type for item in said.output] == ["message"]
    audio = [e for e in answering if e.type == "response.output_audio.delta"]
    assert sum(len(base64.b64decode(e.delta)) for e in audio) == 2 * (SAMPLES_PER_FRAME * FRAMES - 555)
    transcript = "".join(e.delta for e in answering if e.type == "response.output_audio_transcript.delta")
    assert transcript == said.output[0].content[0].transcript != ""
    history = [
        *question,
        {"role": "assistant", "content": None, "tool_calls": [{**tool_call, "id": call.call_id}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": '{"temp_c": 21}'},
    ]
    frames = {"min_audio_frames": FRAMES, "max_audio_frames": FRAMES}
    speech = {"modalities": ["text", "audio"], "audio": {"voice": "ethan", "format": "pcm16"}, **frames}
    spoken = chat(base_url, history, tool_choice="none", max_tokens=5, ignore_eos=True, **speech)
    assert transcript == spoken["choices"][0]["message"]["audio"]["transcript"]
    assert said.usage.input_tokens == spoken["usage"]["prompt_tokens"] > done.usage.input_tokens


def test_a_response_with_its_own_tools_and_a_named_choice_answers_heard_speech(base_url):
    async def talk():
        async with sdk(base_url).realtime.connect(model="qwen3-omni") as conn:
            await conn.recv()
            await conn.session.update(session={**NO_VAD, "output_modalities": ["text"], **GREEDY})
            pcm = (np.clip(speech_like(1.0, 1, 24000), -1, 1) * 32767).astype("<i2").tobytes()
            await conn.input_audio_buffer.append(audio=base64.b64encode(pcm).decode())
            await conn.input_audio_buffer.commit()
            await until(conn, "conversation.item.done")
            other = {"type": "function", "name": "hang_up", "parameters": {"type": "object", "properties": {}}}
            named = {"type": "function", "name": "get_weather"}
            one = {"parallel_tool_calls": False, "max_output_tokens": 200}
            await conn.response.create(response={"tools": [other, TOOL], "tool_choice": named, **one})
            calling = await until(conn)
            await conn.session.update(session={"type": "realtime"})
            return calling, await until(conn, "session.updated")

    calling, updated = asyncio.run(talk())
    (call,) = calling[-1].response.output
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    assert updated[-1].session.tools == [] and updated[-1].session.tool_choice == "auto"  # the session's own


BAD = [
    ({"type": "session.update", "session": {"tools": [{"type": "function", "description": "no name"}]}},
     "missing_required_parameter", "session.tools[0].name"),
    ({"type": "session.update", "session": {"tools": [TOOL, TOOL]}}, "invalid_value", "session.tools[1].name"),
    ({"type": "session.update", "session": {"tools": [TOOL], "tool_choice": {"type": "function", "name": "nope"}}},
     "invalid_value", "session.tool_choice"),
    ({"type": "session.update", "session": {"tool_choice": "required"}}, "invalid_value", "session.tool_choice"),
    ({"type": "session.update", "session": {"tools": [{**TOOL, "parameters": {"type": "object", "minProperties": "x"}}],
                                            "tool_choice": "required"}},
     "invalid_value", "session.tools[0].parameters"),
    ({"type": "session.update", "session": {"tools": [{"type": "mcp", "server_label": "x"}]}}, "invalid_value",
     "session.tools[0].type"),
    ({"type": "conversation.item.create", "item": {"type": "function_call", "arguments": "{}"}},
     "missing_required_parameter", "item.name"),
    ({"type": "conversation.item.create", "item": {"type": "function_call", "name": "f", "arguments": "[1"}},
     "invalid_value", "item.arguments"),
    ({"type": "conversation.item.create", "item": {"type": "function_call_output", "output": "1"}},
     "missing_required_parameter", "item.call_id"),
    ({"type": "conversation.item.create", "item": {**user_text("hi"), "call_id": "call_1"}}, "unknown_parameter",
     "item.call_id"),
    ({"type": "response.create", "response": {"tool_choice": "required"}}, "invalid_value", "response.tool_choice"),
]  # fmt: skip


def test_bad_tools_and_items_get_error_events_and_the_session_goes_on(base_url):
    async def talk():
        url = base_url.replace("http", "ws", 1) + "/v1/realtime"
        async with websockets.connect(url) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
            await ws.send(json.dumps({"type": "conversation.item.create", "item": user_text("hi")}))
            errors = []
            for i, (event, _, _) in enumerate(BAD):
                await ws.send(json.dumps({**event, "event_id": f"evt_{i}"}))
                errors.append(await next_of(ws, "error"))
            session = {**NO_VAD, "output_modalities": ["text"], "max_output_tokens": 2, "tools": [TOOL]}
            await ws.send(json.dumps({"type": "session.update", "session": session}))
            updated = await next_of(ws, "session.updated")
            await ws.send(json.dumps({"type": "response.create", "response": {"tool_choice": "none"}}))
            return errors, updated, await next_of(ws, "response.done")

    errors, updated, done = asyncio.run(talk())
    for i, ((_, code, param), error) in enumerate(zip(BAD, errors, strict=True)):
        assert (error["error"]["code"], error["error"]["param"]) == (code, param), (i, error)
        assert error["error"]["event_id"] == f"evt_{i}" and error["error"]["message"]
    assert updated["session"]["tools"] == [TOOL] and updated["session"]["tool_choice"] == "auto"
    assert done["response"]["status"] == "incomplete" and done["response"]["output"][0]["type"] == "message"


async def next_of(ws, kind: str) -> dict:
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), 60))
        if event["type"] == kind:
            return event


def test_function_calls_join_the_assistant_message_before_them_in_the_prompt():
    conversation = Conversation(ConversationLimits(10**6, 10**6), AudioBudget(10**6))
    items = [
        Message("a", "user", [Part("text", "weather in Paris and Lima?")]),
        Message("b", "assistant", [Part("audio", "Let me look. \n")]),
        FunctionCall("c", "call_1", "get_weather", '{"city": "Paris"}'),
        FunctionCall("d", "call_2", "get_weather", '{"city": "Lima"}'),
        FunctionCallOutput("e", "call_1", "21"),
        FunctionCallOutput("f", "call_2", "17"),
        FunctionCall("g", "call_3", "get_weather", '{"city": "Tokyo"}'),  # a call on its own: a message of its own
    ]
    for item in items:
        conversation.add(item)
    calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": "get_weather", "arguments": f'{{"city": "{c}"}}'}}
        for i, c in ((1, "Paris"), (2, "Lima"), (3, "Tokyo"))
    ]
    assert conversation.chat_messages() == [
        {"role": "user", "content": [{"type": "text", "text": "weather in Paris and Lima?"}]},
        {"role": "assistant", "content": "Let me look.", "tool_calls": calls[:2]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21"},
        {"role": "tool", "tool_call_id": "call_2", "content": "17"},
        {"role": "assistant", "content": None, "tool_calls": calls[2:]},
    ]


def test_client_function_call_items():
    call = item_from_client(p.Item(type="function_call", name="f", arguments='{"x": 1}'), "item", 100)
    assert isinstance(call, FunctionCall) and call.call_id.startswith("call_") and call.arguments == '{"x": 1}'
    assert call.to_json(False) == {
        "id": call.id, "object": "realtime.item", "type": "function_call", "status": "completed", "name": "f",
        "call_id": call.call_id, "arguments": '{"x": 1}',
    }  # fmt: skip
    output = item_from_client(p.Item(type="function_call_output", call_id="call_9", output="ok"), "item", 100)
    assert output.chat_message() == {"role": "tool", "tool_call_id": "call_9", "content": "ok"}
    with pytest.raises(APIError) as e:
        item_from_client(p.Item(type="function_call_output", call_id="c", output="", role="user"), "item", 100)
    assert e.value.param == "item.role" and e.value.code == "unknown_parameter"


class ScriptedRun:
    """An engine run that streams the given events (a stand-in for ``EngineRun``)."""

    def __init__(self, events: list):
        self.events = iter(events)

    async def first_event(self):
        return next(self.events)

    next_event = first_event

    async def close(self) -> None:
        pass


class Events:
    """Collects server events as the session's emitter sends them (in the dialect asked for)."""

    def __init__(self, is_beta: bool):
        self.is_beta, self.sent = is_beta, []

    async def __call__(self, kind: str, **fields) -> None:
        event = p.server_event(kind, self.is_beta, **fields)
        if event is not None:
            self.sent.append(event)


SERVER_EVENT = {False: pydantic.TypeAdapter(RealtimeServerEvent), True: pydantic.TypeAdapter(BetaServerEvent)}


def scripted_response(texts: list[str], finish_reason: str = "stop", audio: bool = True, is_beta: bool = False):
    """A spoken response with tools whose engine writes ``texts`` (audio after the first, if ``audio``)."""
    deltas = [Delta("r", "text", text) for text in texts]
    if audio:
        deltas.insert(1, Delta("r", "audio", np.zeros(480, np.float32)))
    output = {"finish_reason": finish_reason, "token_ids": [1, 2], "prompt_token_ids": [3], "codes": None}
    output |= {"num_cached_tokens": 0, "num_audio_prompt_tokens": 0}
    conversation = Conversation(ConversationLimits(10**6, 10**6), AudioBudget(10**6))
    conversation.add(Message("u", "user", [Part("text", "weather?")]))
    events = Events(is_beta)
    request = {"tools": [CHAT_TOOL], "tool_choice": "auto"}
    run = ScriptedRun([*deltas, Finished("r", output)])
    response = Response(events, lambda _: run, request, conversation, speaks=True, parses_tools=True)
    return response, events, conversation


@pytest.mark.parametrize("is_beta", [False, True], ids=["ga", "beta"])
def test_a_response_with_speech_and_two_calls_as_the_sdk_types_read_it(is_beta):
    call = '<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{}", "days": 2}}}}\n</tool_call>'
    text = "Let me look.\n" + call.format("Paris") + "\n" + call.format("Lima")
    response, events, conversation = scripted_response([text[:9], text[9:30], text[30:]], is_beta=is_beta)
    asyncio.run(response.run())
    for event in events.sent:  # strictly, as the SDK's own models declare them
        SERVER_EVENT[is_beta].validate_python(event)
    done = events.sent[-1]["response"]
    message, *calls = done["output"]
    assert done["status"] == "completed" and message["content"][0]["transcript"] == "Let me look.\n"
    assert [(c["name"], c["status"], c["arguments"]) for c in calls] == [
        ("get_weather", "completed", f'{{"city": "{city}", "days": 2}}') for city in ("Paris", "Lima")
    ]
    for index, c in enumerate(calls, 1):
        mine = [e for e in events.sent if e.get("item_id") == c["id"]]
        assert all(e["output_index"] == index and e["call_id"] == c["call_id"] for e in mine)
        deltas = "".join(e["delta"] for e in mine if e["type"] == "response.function_call_arguments.delta")
        assert deltas == c["arguments"] == mine[-1]["arguments"]
    added = [e["item"]["id"] for e in events.sent if e["type"] == "response.output_item.added"]
    assert added == [message["id"], *(c["id"] for c in calls)] == [i.id for i in conversation.items[1:]]
    assert conversation.chat_messages()[1] == {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {"id": c["call_id"], "type": "function", "function": {"name": "get_weather", "arguments": c["arguments"]}}
            for c in calls
        ],
    }


def test_a_call_cut_off_is_incomplete_and_its_text_is_the_message():
    cut = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'
    response, events, conversation = scripted_response(["\n", cut], finish_reason="length", audio=False)
    asyncio.run(response.run())
    for event in events.sent:
        SERVER_EVENT[False].validate_python(event)
    done = events.sent[-1]["response"]
    call, message = done["output"]
    assert done["status"] == "incomplete" and call["status"] == message["status"] == "incomplete"
    assert call["arguments"] == '{"city": "Par' and message["content"][0]["transcript"] == "\n" + cut
    assert conversation.chat_messages()[1:] == [{"role": "assistant", "content": "\n" + cut}]
