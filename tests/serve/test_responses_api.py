"""The Responses API (/v1/responses) with the official `openai` client against a live tiny server.

A Responses request is the same engine request as the chat completion it translates to, so the
references are the chat answers (greedy: equal text and token counts) and the declared schemas
(every well-formed call or JSON object on the random-weight checkpoint is the grammar's doing).

The OpenAI Agents SDK (``openai-agents``), unmodified, against a live tiny server: an ``Agent`` on
the SDK's default model provider (the Responses API), and on ``OpenAIChatCompletionsModel`` (chat
completions), calls a function tool, reads its result and returns a pydantic ``output_type``. On
random weights every call and every parsed answer is the grammars' doing (tool_choice "required" for
the first turn, the output type's JSON schema after)."""

import asyncio
import base64
import json
import time
from typing import Annotated

import httpx
import jsonschema
import openai
import pydantic
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    RunConfig,
    Runner,
    function_tool,
    set_default_openai_client,
)
from helpers.live_server import png_data_url, server
from helpers.qwen3_omni import AUDIO, IMAGE, wav_data_url
from openai.types.responses import Response, ResponseStreamEvent

from omniwalk.bench.schemas import SCHEMAS
from omniwalk.serve.response_store import ResponseStore

MODEL = "qwen3-omni"
STREAM_EVENT = pydantic.TypeAdapter(ResponseStreamEvent)
GREEDY = {"temperature": 0.0}
FIXED = {"ignore_eos": True}  # (extra body: the answer runs to max_output_tokens)
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "the forecast for a city",
    "parameters": SCHEMAS["weather_tool_args"],
    "strict": True,
}


def chat_twin(client, content, max_tokens: int):
    """The chat completion a Responses request with this user content translates to."""
    messages = [{"role": "user", "content": content}]
    return client.chat.completions.create(
        model=MODEL, messages=messages, max_completion_tokens=max_tokens, extra_body=FIXED, **GREEDY
    )


def check_same_as_chat(response, chat) -> None:
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.output_tokens == chat.usage.completion_tokens
    assert response.usage.total_tokens == chat.usage.total_tokens


def test_text_input_is_the_chat_answer(client):
    r = client.responses.create(model=MODEL, input="hello world", max_output_tokens=6, extra_body=FIXED, **GREEDY)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == MODEL
    assert [item.type for item in r.output] == ["message"] and r.output[0].status == "incomplete"
    assert r.usage.output_tokens == 6
    check_same_as_chat(r, chat_twin(client, "hello world", 6))


def test_image_input_is_the_chat_answer(client):
    url = png_data_url(IMAGE)
    content = [{"type": "input_image", "image_url": url, "detail": "auto"}, {"type": "input_text", "text": "what"}]
    r = client.responses.create(
        model=MODEL, input=[{"role": "user", "content": content}], max_output_tokens=5, extra_body=FIXED, **GREEDY
    )
    chat = chat_twin(client, [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "what"}], 5)
    check_same_as_chat(r, chat)
    assert r.usage.input_tokens > 40  # (the image's placeholder tokens are in the prompt)


def test_audio_input_is_the_chat_answer(client):
    data = wav_data_url(AUDIO).split(",", 1)[1]
    audio = {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}
    r = client.responses.create(
        model=MODEL, input=[{"role": "user", "content": [audio]}], max_output_tokens=5, extra_body=FIXED, **GREEDY
    )
    check_same_as_chat(r, chat_twin(client, [audio], 5))


class Verdict(pydantic.BaseModel):
    answer: bool
    confidence: int = pydantic.Field(ge=0, le=9)


def test_stream_deltas_make_the_final_response(client):
    fields = dict(model=MODEL, input="is it raining", max_output_tokens=60, **GREEDY)
    deltas, kinds = [], []
    with client.responses.stream(text_format=Verdict, **fields) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added", kinds[3]]
    assert kinds[-1] == "response.completed" and final.status == "completed"
    assert "".join(deltas) == final.output_text
    assert isinstance(final.output_parsed, Verdict)
    whole = client.responses.create(text={"format": stream_format()}, **fields)
    assert whole.output_text == final.output_text and whole.usage.output_tokens == final.usage.output_tokens
    assert client.responses.retrieve(final.id).output_text == final.output_text  # (stored at the end)


def stream_format() -> dict:
    """The text.format the SDK sends for ``text_format=Verdict``."""
    from openai.lib._pydantic import to_strict_json_schema

    return {"type": "json_schema", "name": "Verdict", "schema": to_strict_json_schema(Verdict), "strict": True}


@pytest.mark.parametrize("max_tokens", [4, 200])
def test_events_and_bodies_are_the_sdk_types(base_url, max_tokens):
    """Every event and the whole body validate against the `openai` package's types (strictly, not as
    the client reads them, which accepts missing fields); sequence numbers count up; items close."""
    body = {"model": MODEL, "input": "hi", "max_output_tokens": max_tokens, "tools": [WEATHER]}
    body.update(tool_choice="required", parallel_tool_calls=False, temperature=0.0)
    with httpx.stream("POST", f"{base_url}/v1/responses", json={**body, "stream": True}, timeout=60) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    for event in events:
        STREAM_EVENT.validate_python(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    added = [e["item"]["id"] for e in events if e["type"] == "response.output_item.added"]
    done = [e["item"]["id"] for e in events if e["type"] == "response.output_item.done"]
    assert added == done and events[-1]["type"] == ("response.incomplete" if max_tokens == 4 else "response.completed")
    whole = httpx.post(f"{base_url}/v1/responses", json=body, timeout=60).json()
    assert Response.model_validate(whole).status == events[-1]["response"]["status"]


def test_function_tool_round_trip(client):
    first = client.responses.create(
        model=MODEL,
        input="weather in paris?",
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=200,
        **GREEDY,
    )
    assert first.status == "completed"
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls and all(call.name == "get_weather" and call.status == "completed" for call in calls)
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    results = [{"type": "function_call_output", "call_id": c.call_id, "output": '{"sky": "clear"}'} for c in calls]
    second = client.responses.create(
        model=MODEL, previous_response_id=first.id, input=results, tools=[WEATHER], max_output_tokens=6, **GREEDY
    )
    assert second.output[0].type == "message" and second.output_text
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    # the same conversation sent whole (the SDKs' way without previous_response_id) is the same prompt
    called = [call.model_dump(exclude_none=True) for call in calls]
    history = [{"role": "user", "content": "weather in paris?"}, *called, *results]
    whole = client.responses.create(model=MODEL, input=history, tools=[WEATHER], max_output_tokens=6, **GREEDY)
    assert whole.usage.input_tokens == second.usage.input_tokens and whole.output_text == second.output_text


def test_streamed_calls_are_the_whole_ones(client):
    fields = dict(model=MODEL, input="weather?", tools=[WEATHER], tool_choice="required", max_output_tokens=200)
    fields["parallel_tool_calls"] = False
    whole = client.responses.create(**fields, **GREEDY)
    arguments = {}
    with client.responses.stream(**fields, **GREEDY) as stream:
        for event in stream:
            if event.type == "response.function_call_arguments.delta":
                arguments[event.output_index] = arguments.get(event.output_index, "") + event.delta
        final = stream.get_final_response()
    expected = [(item.name, item.arguments) for item in whole.output]
    assert [(item.name, item.arguments) for item in final.output] == expected
    assert [arguments[i] for i in sorted(arguments)] == [a for _, a in expected]


@pytest.mark.parametrize("name", ["booking", "event", "any_of_objects", "array_of_objects"])
def test_json_schema_output_validates(client, name):
    fmt = {"type": "json_schema", "name": name, "schema": SCHEMAS[name], "strict": True}
    r = client.responses.create(
        model=MODEL, input="json", text={"format": fmt}, max_output_tokens=400, temperature=1.0, extra_body={"seed": 7}
    )
    assert r.status == "completed" and r.text.format.type == "json_schema"
    jsonschema.validate(json.loads(r.output_text), SCHEMAS[name])


def test_previous_response_id_continues_the_conversation(client):
    """A continued response's prompt is the stored conversation (never its instructions) plus its input:
    the same as the conversation sent whole."""
    fields = dict(model=MODEL, max_output_tokens=5, extra_body=FIXED, **GREEDY)

    def whole(first, question: str):
        said = first.output[0].model_dump(exclude_none=True)
        items = [{"role": "user", "content": "my name is ada"}, said, {"role": "user", "content": question}]
        return client.responses.create(input=items, **fields)

    first = client.responses.create(input="my name is ada", **fields)
    second = client.responses.create(input="what is my name", previous_response_id=first.id, **fields)
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    reference = whole(first, "what is my name")
    assert (second.usage.input_tokens, second.output_text) == (reference.usage.input_tokens, reference.output_text)
    told = client.responses.create(input="my name is ada", instructions="be brief", **fields)
    system = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "my name is ada"}]
    twin = client.chat.completions.create(model=MODEL, messages=system, max_completion_tokens=5, **GREEDY)
    assert told.instructions == "be brief" and told.usage.input_tokens == twin.usage.prompt_tokens
    after = client.responses.create(input="and now", previous_response_id=told.id, **fields)
    assert after.usage.input_tokens == whole(told, "and now").usage.input_tokens


def test_a_required_call_with_a_text_format_answers_calls(client):
    """The answer is calls only, so text.format does not apply (an Agent's first turn sends both)."""
    fmt = {"type": "json_schema", "name": "s", "schema": SCHEMAS["booking"], "strict": True}
    r = client.responses.create(
        model=MODEL,
        input="weather?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        parallel_tool_calls=False,
        text={"format": fmt},
        max_output_tokens=200,
        **GREEDY,
    )
    assert [item.type for item in r.output] == ["function_call"] and r.text.format.name == "s"
    jsonschema.validate(json.loads(r.output[0].arguments), WEATHER["parameters"])


def test_retrieve_delete_and_cancel(client, base_url):
    r = client.responses.create(model=MODEL, input="hi", max_output_tokens=3, metadata={"k": "v"})
    got = client.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump() and got.metadata == {"k": "v"}
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(r.id)  # (only background responses can be; none runs in the background here)
    client.responses.delete(r.id)
    for call in (client.responses.retrieve, client.responses.delete, client.responses.cancel):
        with pytest.raises(openai.NotFoundError):
            call(r.id)
    unstored = client.responses.create(model=MODEL, input="hi", max_output_tokens=3, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


AUDIO_PART = {"type": "input_audio", "input_audio": {"data": base64.b64encode(b"not audio").decode(), "format": "wav"}}
NOT_SCHEMA = {"type": "json_schema", "name": "s", "schema": {"type": "object", "not": {}}}
IMAGE_BY_ID = {"type": "input_image", "file_id": "f"}
BAD = [
    ({"text": {"format": NOT_SCHEMA}}, "text.format.schema"),
    ({"text": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}, "text.format.name"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "name": "bad name"}]}, "tools[0].name"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"tool_choice": {"type": "file_search"}}, "tool_choice.type"),
    ({"input": [{"role": "user", "content": [AUDIO_PART]}]}, "input[0].content[0].input_audio.data"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0].type"),
    ({"input": [{"role": "user", "content": [IMAGE_BY_ID]}]}, "input[0].content[0].file_id"),
    ({"tools": [{**WEATHER, "parameters": {"type": "objec"}}], "tool_choice": "required"}, "tools[0].parameters"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
    ({"input": [{"content": "no role, no type"}]}, "input[0]"),
    ({"input": [{"role": "user", "content": [{"text": "no type"}]}]}, "input[0].content[0]"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    ({"max_output_tokens": 10**6}, "max_output_tokens"),
    ({"reasoning": {"effort": "low", "summary": None}}, "reasoning"),
    ({"background": True}, "background"),
    ({"unknown_field": 1}, "unknown_field"),
]


@pytest.mark.parametrize(("fields", "param"), BAD)
def test_bad_input_is_a_400_naming_the_field(base_url, fields, param):
    r = httpx.post(f"{base_url}/v1/responses", json={"input": "hi", "max_output_tokens": 2, **fields}, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and ".function." not in error["message"], error


def test_unset_unsupported_fields_are_accepted(client):
    fields = dict(reasoning={"effort": None}, background=False, include=[], max_tool_calls=None, truncation="auto")
    r = client.responses.create(model=MODEL, input="hi", max_output_tokens=2, extra_body=FIXED, **fields)
    assert r.status == "incomplete" and r.usage.output_tokens == 2


def test_an_unknown_previous_response_is_a_400_as_openai_answers(base_url):
    body = {"input": "hi", "previous_response_id": "resp_unknown"}
    r = httpx.post(f"{base_url}/v1/responses", json=body, timeout=60)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "previous_response_id"
    assert r.json()["error"]["code"] == "previous_response_not_found"


def test_the_store_is_bounded_by_count_bytes_and_time(monkeypatch):
    store = ResponseStore(capacity=2, expiry_s=60, max_bytes=10_000)
    for name in ("a", "b", "c"):
        store.put({"id": name}, [{"role": "user", "content": name}])
    assert store.get("a") is None and store.get("b").items == [{"role": "user", "content": "b"}] and len(store) == 2
    store.put({"id": "big"}, [{"role": "user", "content": "x" * 9_000}])
    assert store.get("b") is None and store.get("c") is not None  # (the oldest went to make room)
    store.put({"id": "huge"}, [{"role": "user", "content": "x" * 20_000}])
    assert len(store) == 0 and store.num_bytes == 0  # (one over the bound is not kept either)
    store.put({"id": "d"}, [])
    now = time.time()
    monkeypatch.setattr(time, "time", lambda: now + 61)
    assert store.get("d") is None and store.num_bytes == 0
    assert not store.delete("d")


def test_every_responses_route_needs_the_key():
    with server("--api-key", "secret") as base:
        keyed = openai.OpenAI(base_url=f"{base}/v1", api_key="secret", max_retries=0)
        stranger = openai.OpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0)
        r = keyed.responses.create(model=MODEL, input="hi", max_output_tokens=2)
        calls = [
            lambda: stranger.responses.create(model=MODEL, input="hi", max_output_tokens=2),
            lambda: stranger.responses.retrieve(r.id),
            lambda: stranger.responses.delete(r.id),
            lambda: stranger.responses.cancel(r.id),
        ]
        for call in calls:
            with pytest.raises(openai.AuthenticationError):
                call()
        assert keyed.responses.retrieve(r.id).id == r.id


class Forecast(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=12)
    warm: bool


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
def test_an_agent_calls_a_tool_and_returns_its_output_type(base_url, api):
    calls = []

    @function_tool
    def get_weather(city: Annotated[str, pydantic.Field(max_length=12)]) -> str:
        """The weather in a city."""
        calls.append(city)
        return "sunny, 24 C"

    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    set_default_openai_client(client)
    agent = Agent(
        name="forecaster",
        instructions="Look the weather up, then answer.",
        model=MODEL if api == "responses" else OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
        tools=[get_weather],
        output_type=Forecast,
        # (the SDK resets tool_choice after a tool has run: the next turn answers)
        model_settings=ModelSettings(
            tool_choice="required", parallel_tool_calls=False, temperature=0.0, max_tokens=300
        ),
    )
    result = asyncio.run(Runner.run(agent, "Is it warm in Paris?", run_config=RunConfig(tracing_disabled=True)))
    assert len(calls) >= 1 and all(isinstance(city, str) for city in calls)
    assert isinstance(result.final_output, Forecast)
    kinds = [item.type for item in result.new_items]
    assert kinds[0] == "tool_call_item" and "tool_call_output_item" in kinds and kinds[-1] == "message_output_item"
