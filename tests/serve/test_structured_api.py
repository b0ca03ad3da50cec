"""Structured outputs over HTTP with the official `openai` client: ``response_format`` (json_object,
json_schema) and vLLM's ``structured_outputs`` (regex, choice, grammar) on the tiny random-weight
checkpoint, whose every valid output is the grammar's doing; bad ones are 400s naming the field."""

import asyncio
import json
import re
import time

import httpx
import jsonschema
import pytest

from omniwalk.bench.schemas import SCHEMAS
from omniwalk.serve import openai_api
from omniwalk.serve.errors import APIError
from omniwalk.structured import grammars

USER = [{"role": "user", "content": "answer in the format asked"}]
# a few of the corpus (the grammar tests sweep all of it offline): nesting, bounds, enums, anyOf,
# patterns, $defs, top-level non-objects
SOME_SCHEMAS = ("flat_object", "nested_three", "any_of_objects", "string_pattern_code", "defs_ref", "top_level_array")


def create(client, **fields):
    extra = {key: fields.pop(key) for key in ("structured_outputs", "seed", "top_k") if key in fields}
    return client.chat.completions.create(model="qwen3-omni", messages=USER, extra_body=extra, **fields)


@pytest.mark.parametrize("name", SOME_SCHEMAS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_outputs_validate(client, name, temperature):
    schema = SCHEMAS[name]
    response_format = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
    r = create(client, response_format=response_format, max_tokens=400, temperature=temperature, seed=7)
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    jsonschema.validate(json.loads(choice.message.content), schema)


def test_streamed_json_schema_equals_the_whole(client):
    schema = SCHEMAS["array_of_objects"]
    fields = dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    whole = create(client, max_tokens=400, temperature=0.0, **fields).choices[0].message.content
    stream = create(client, max_tokens=400, temperature=0.0, stream=True, **fields)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == whole
    jsonschema.validate(json.loads(text), schema)


# json_object bounds no string: a random model that opens one may never close it, so the sampled
# cases are seeds whose draw closes the object (greedy closes it at once)
@pytest.mark.parametrize("temperature, seed", [(0.0, 1), (1.0, 2), (1.0, 3)])
def test_json_object_parses_to_an_object(client, temperature, seed):
    r = create(client, response_format={"type": "json_object"}, max_tokens=400, temperature=temperature, seed=seed)
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_regex_choice_and_grammar_are_honoured(client):
    pattern = r"(yes|no), [0-9]{2,4} (cats|dogs)\."
    for seed in (1, 2, 3):
        text = create(client, structured_outputs={"regex": pattern}, max_tokens=40, temperature=1.0, seed=seed)
        assert re.fullmatch(pattern, text.choices[0].message.content), text.choices[0].message.content
    choices = ["paris", "rome", "new york city"]
    picked = {
        create(client, structured_outputs={"choice": choices}, max_tokens=20, temperature=1.0, seed=seed)
        .choices[0]
        .message.content
        for seed in range(6)
    }
    assert picked <= set(choices)
    grammar = 'root ::= sum "=" num\nsum ::= num ("+" num)*\nnum ::= [1-9] [0-9]?'
    for seed in (1, 2):
        text = create(client, structured_outputs={"grammar": grammar}, max_tokens=60, temperature=1.0, seed=seed)
        assert re.fullmatch(r"[1-9][0-9]?(\+[1-9][0-9]?)*=[1-9][0-9]?", text.choices[0].message.content)


BAD = [
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
    long = {"messages": USER, "max_tokens": 48, "ignore_eos": True, "temperature": 0.0}

    async def run():
        async with httpx.AsyncClient(timeout=300) as h:
            alone = (await h.post(url, json=long)).json()
            running = asyncio.create_task(h.post(url, json=long))
            bad = [await h.post(url, json={"messages": USER, "max_tokens": 4, **body}) for body, _ in BAD]
            return alone, await running, bad

    alone, during, bad = asyncio.run(run())
    for (body, param), r in zip(BAD, bad, strict=True):
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
