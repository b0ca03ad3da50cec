"""Structured outputs over HTTP with the official `openai` client: ``response_format`` (json_object,
json_schema) and vLLM's ``structured_outputs`` (regex, choice, grammar) on the tiny random-weight
checkpoint, whose every valid output is the grammar's doing; bad ones are 400s naming the field.

Tool calling over HTTP with the official `openai` client, on the tiny random-weight checkpoint
(every well-formed call is the grammar's doing): forced calls parse and their arguments validate
against the declared parameters, streamed calls equal the whole ones, a history with calls and
their results is served, bad tools are 400s naming the field, and a spoken answer never voices a call."""

import asyncio
import base64
import io
import json
import re
import shutil
import time

import httpx
import jsonschema
import pytest
import soundfile
from helpers.live_server import launch
from helpers.qwen3_omni import checkpoint

from omniwalk.bench.schemas import SCHEMAS
from omniwalk.serve import openai_api
from omniwalk.serve.errors import APIError
from omniwalk.serve.tool_responses import ToolDeltas, read_message
from omniwalk.structured import grammars

FORMAT_USER = [{"role": "user", "content": "answer in the format asked"}]
# a few of the corpus (the grammar tests sweep all of it offline): nesting, bounds, enums, anyOf,
# patterns, $defs, top-level non-objects
SOME_SCHEMAS = ("flat_object", "nested_three", "any_of_objects", "string_pattern_code", "defs_ref", "top_level_array")


def create_formatted(client, **fields):
    extra = {key: fields.pop(key) for key in ("structured_outputs", "seed", "top_k") if key in fields}
    return client.chat.completions.create(model="qwen3-omni", messages=FORMAT_USER, extra_body=extra, **fields)


@pytest.mark.parametrize("name", SOME_SCHEMAS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_outputs_validate(client, name, temperature):
    schema = SCHEMAS[name]
    response_format = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
    r = create_formatted(client, response_format=response_format, max_tokens=400, temperature=temperature, seed=7)
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    jsonschema.validate(json.loads(choice.message.content), schema)


def test_streamed_json_schema_equals_the_whole(client):
    schema = SCHEMAS["array_of_objects"]
    fields = dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    whole = create_formatted(client, max_tokens=400, temperature=0.0, **fields).choices[0].message.content
    stream = create_formatted(client, max_tokens=400, temperature=0.0, stream=True, **fields)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == whole
    jsonschema.validate(json.loads(text), schema)


# json_object bounds no string: a random model that opens one may never close it, so the sampled
# cases are seeds whose draw closes the object (greedy closes it at once)
@pytest.mark.parametrize("temperature, seed", [(0.0, 1), (1.0, 2), (1.0, 3)])
def test_json_object_parses_to_an_object(client, temperature, seed):
    r = create_formatted(
        client, response_format={"type": "json_object"}, max_tokens=400, temperature=temperature, seed=seed
    )
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_regex_choice_and_grammar_are_honoured(client):
    pattern = r"(yes|no), [0-9]{2,4} (cats|dogs)\."
    for seed in (1, 2, 3):
        text = create_formatted(
            client, structured_outputs={"regex": pattern}, max_tokens=40, temperature=1.0, seed=seed
        )
        assert re.fullmatch(pattern, text.choices[0].message.content), text.choices[0].message.content
    choices = ["paris", "rome", "new york city"]
    picked = {
        create_formatted(client, structured_outputs={"choice": choices}, max_tokens=20, temperature=1.0, seed=seed)
        .choices[0]
        .message.content
        for seed in range(6)
    }
    assert picked <= set(choices)
    grammar = 'root ::= sum "=" num\nsum ::= num ("+" num)*\nnum ::= [1-9] [0-9]?'
    for seed in (1, 2):
        text = create_formatted(
            client, structured_outputs={"grammar": grammar}, max_tokens=60, temperature=1.0, seed=seed
        )
        assert re.fullmatch(r"[1-9][0-9]?(\+[1-9][0-9]?)*=[1-9][0-9]?", text.choices[0].message.content)


BAD_FORMATS = [
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
        "response_format.json_schema.schema",
    ),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {"type": "x"}}}}},
        "response_format.json_schema.schema",
    ),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({"structured_outputs": {}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs.regex"),
    ({"structured_outputs": {"grammar": "root ::= undefined_rule"}}, "structured_outputs.grammar"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
    ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}}, "structured_outputs"),
]


def test_bad_constraints_are_400s_naming_the_field_and_others_in_flight_are_unaffected(base_url):
    url = f"{base_url}/v1/chat/completions"
    long = {"messages": FORMAT_USER, "max_tokens": 48, "ignore_eos": True, "temperature": 0.0}

    async def run():
        async with httpx.AsyncClient(timeout=300) as h:
            alone = (await h.post(url, json=long)).json()
            running = asyncio.create_task(h.post(url, json=long))
            bad = [
                await h.post(url, json={"messages": FORMAT_USER, "max_tokens": 4, **body}) for body, _ in BAD_FORMATS
            ]
            return alone, await running, bad

    alone, during, bad = asyncio.run(run())
    for (body, param), r in zip(BAD_FORMATS, bad, strict=True):
        assert r.status_code == 400, (body, r.text)
        error = r.json()["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error", (body, error)
    assert during.status_code == 200
    assert during.json()["choices"][0]["message"] == alone["choices"][0]["message"]
    assert during.json()["usage"]["completion_tokens"] == 48


def test_a_grammar_that_takes_too_long_to_check_is_a_400_naming_its_field(monkeypatch):
    monkeypatch.setattr(grammars, "constraint_of", lambda request: time.sleep(0.5))
    for structured, param in [
        ({"structured_outputs": {"regex": "a+"}}, "structured_outputs.regex"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"tools": [], "tool_choice": "auto"}, "tools"),
    ]:
        with pytest.raises(APIError) as e:
            asyncio.run(openai_api.check_grammar(structured, 0.05))
        assert e.value.status == 400 and e.value.param == param and "too long" in str(e.value)


USER = [{"role": "user", "content": "what is the weather in paris, and book me a table"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "the forecast for a city",
            "parameters": SCHEMAS["weather_tool_args"],
        },
    },
    {"type": "function", "function": {"name": "book_table", "parameters": SCHEMAS["booking"]}},
    {"type": "function", "function": {"name": "ping"}},  # no parameters: arguments {}
]
PARAMETERS = {t["function"]["name"]: t["function"].get("parameters", {"type": "object"}) for t in TOOLS}
SPEECH = {"talker_temperature": 0.0, "code_predictor_temperature": 0.0, "max_audio_frames": 12}


def create(client, messages=USER, extra=None, **fields):
    fields = {"model": "qwen3-omni", "tools": TOOLS, "max_tokens": 300, **fields}
    return client.chat.completions.create(messages=messages, extra_body=extra, **fields)


def check_calls(calls, names=None) -> None:
    """Each call names a declared function and its arguments validate against its parameters."""
    assert calls
    for call in calls:
        assert re.fullmatch(r"call_[0-9a-f]{24}", call.id) and call.type == "function"
        assert call.function.name in (names or PARAMETERS)
        jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_required_calls_parse_and_validate(client, seed):
    r = create(client, tool_choice="required", parallel_tool_calls=False, temperature=1.0, seed=seed)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert len(choice.message.tool_calls) == 1
    check_calls(choice.message.tool_calls)


@pytest.mark.parametrize("name", ["get_weather", "book_table", "ping"])
def test_a_named_choice_calls_that_function(client, name):
    choice = {"type": "function", "function": {"name": name}}
    r = create(client, tool_choice=choice, temperature=1.0, seed=5)
    assert r.choices[0].finish_reason == "tool_calls"
    check_calls(r.choices[0].message.tool_calls, names=[name])


def test_streamed_tool_calls_concatenate_to_the_whole_ones(client):
    fields = dict(tool_choice="required", temperature=0.0, extra={"seed": 3}, max_tokens=400)
    whole = create(client, **fields).choices[0]
    calls, content, reasons = {}, [], []
    for chunk in create(client, stream=True, **fields):
        for choice in chunk.choices:
            content.append(choice.delta.content or "")
            reasons.append(choice.finish_reason)
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": None, "name": None, "arguments": ""})
                if delta.id is not None:
                    assert call["id"] is None  # the call's start comes once, with its id, type and name
                    call.update(id=delta.id, name=delta.function.name)
                call["arguments"] += delta.function.arguments or ""
    expected = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)] == expected
    assert ("".join(content) or None) == whole.message.content
    assert reasons[-1] == whole.finish_reason
    check_calls(whole.message.tool_calls)


def test_a_history_with_calls_and_results_is_served(client):
    first = create(client, tool_choice={"type": "function", "function": {"name": "get_weather"}}, temperature=0.0)
    call = first.choices[0].message.tool_calls[0]
    history = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"sky": "clear", "high": 21})},
    ]
    r = create(client, messages=history, max_tokens=8, extra={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 8
    assert r.usage.prompt_tokens > first.usage.prompt_tokens  # the call and its result are in the prompt


def test_tool_choice_none_and_auto_answer_text(client):
    for choice in ("none", "auto"):
        r = create(client, tool_choice=choice, max_tokens=6, extra={"ignore_eos": True})
        assert r.choices[0].finish_reason == "length" and r.choices[0].message.tool_calls is None
        assert r.choices[0].message.content


SCRIPTED = [
    ' Sure. <tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n'
    '<tool_call>\n{"name": "g"}\n</tool_call>\n',
    '<tool_call>{"name": "f", "arguments": {"s": "</tool_call>"}}</tool_call>  then \n more  <tool_call> broken',
    "no calls at all\n\n",
    "   ",
]


@pytest.mark.parametrize("text", SCRIPTED)
def test_streamed_deltas_are_the_whole_message_for_any_split(text):
    """Content deltas concatenate to the non-streamed content (stripped: whitespace at either end is
    never sent) and argument deltas to each call's arguments, whether the text comes whole or a
    character at a time."""
    content, calls = read_message(text)
    for pieces in ([text], list(text)):
        stream = ToolDeltas(lambda piece: {"content": piece})
        deltas = [delta for piece in pieces for delta in stream.feed(piece)] + stream.finish()
        assert ("".join(d.get("content", "") for d in deltas) or None) == content
        streamed = {}
        for delta in (entry for d in deltas for entry in d.get("tool_calls", [])):
            call = streamed.setdefault(delta["index"], {"name": None, "arguments": ""})
            call["name"] = delta["function"].get("name", call["name"])
            call["arguments"] += delta["function"]["arguments"]
        assert [streamed[i] for i in sorted(streamed)] == [c["function"] for c in calls]
        assert stream.has_calls == bool(calls)


BAD = [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    (
        {
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "objec"}}}],
            "tool_choice": "required",
        },
        "tools",
    ),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
    ({"tools": [], "tool_choice": "required"}, "tool_choice"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"messages": [*USER, {"role": "tool", "content": "x"}]}, "messages[1].tool_call_id"),
    ({"messages": [*USER, {"role": "function", "name": "f", "content": "x"}]}, "messages[1].role"),
]


def test_bad_tools_are_400s_naming_the_field(base_url):
    for body, param in BAD:
        full = {"messages": USER, "tools": TOOLS, "max_tokens": 2, **body}
        r = httpx.post(f"{base_url}/v1/chat/completions", json=full, timeout=60)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["param"].startswith(param), (body, r.json())


# a chat template that never reads ``tools``
NO_TOOLS_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


def test_a_template_without_tools_answers_400_naming_tools(tmp_path):
    """The engine refuses tools it cannot render: a 400 whose param crosses the process boundary."""
    path = shutil.copytree(checkpoint("tiny"), tmp_path / "no_tools")
    (path / "chat_template.jinja").write_text(NO_TOOLS_TEMPLATE)
    config = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": NO_TOOLS_TEMPLATE}))
    proc, base = launch(model=path)
    try:
        url = f"{base}/v1/chat/completions"
        r = httpx.post(url, json={"messages": USER, "tools": TOOLS, "max_tokens": 2}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text
        assert "chat template" in r.json()["error"]["message"]
        assert httpx.post(url, json={"messages": USER, "max_tokens": 2}, timeout=60).status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def decoded_samples(message) -> int:
    samples, _ = soundfile.read(io.BytesIO(base64.b64decode(message.audio.data)), dtype="float32")
    return len(samples)


def test_spoken_answer_never_voices_a_call_and_the_follow_up_is_spoken(client):
    fields = dict(parallel_tool_calls=False, temperature=0.0, modalities=["text", "audio"], extra=SPEECH)
    wav = {"voice": "ethan", "format": "wav"}
    r = create(client, tool_choice="required", audio=wav, **fields)
    message = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and message.content is None
    check_calls(message.tool_calls)
    assert message.audio.transcript == "" and decoded_samples(message) == 0
    pcm, transcript, calls = b"", "", []
    stream = create(client, tool_choice="required", audio={"voice": "ethan", "format": "pcm16"}, stream=True, **fields)
    for chunk in stream:
        for choice in chunk.choices:
            audio = getattr(choice.delta, "audio", None)
            pcm += base64.b64decode(getattr(audio, "data", None) or "")
            transcript += getattr(audio, "transcript", None) or ""
            calls += choice.delta.tool_calls or []
    assert pcm == b"" and transcript == "" and calls
    # the follow-up turn, after the call's result, is spoken
    call = message.tool_calls[0]
    history = [
        *USER,
        {"role": "assistant", "audio": {"id": message.audio.id}, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "done"},
    ]
    extra = {**SPEECH, "ignore_eos": True}
    follow_up = create(client, messages=history, audio=wav, max_tokens=4, **{**fields, "extra": extra}).choices[0]
    assert follow_up.finish_reason == "length" and follow_up.message.tool_calls is None
    assert follow_up.message.audio.transcript and decoded_samples(follow_up.message) > 0
