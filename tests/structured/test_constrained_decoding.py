"""Constrained decoding on the tiny Qwen3-Omni (random weights, CPU): every output follows its grammar.

With random weights a valid output is the grammar's doing alone. The 44 schemas of the bench's corpus
run concurrently (one batch of 44: past 32 at once), greedy and sampled, and each output validates
with ``jsonschema``; json_object, regex, choice and GBNF outputs are checked by their own rules;
required and named tool calls parse and their arguments validate against the function's parameters.
An unconstrained request's ids are the same beside constrained ones as alone, bit for bit.
"""

import json
import re

import jsonschema
import pytest
from helpers.qwen3_omni import omni

from omniwalk.bench.schemas import SCHEMAS
from omniwalk.errors import InvalidRequestError
from omniwalk.structured.grammars import MAX_TOOL_CALLS
from omniwalk.structured.tools import parse_tool_calls

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "parameters": SCHEMAS["weather_tool_args"]},
    },
    {"type": "function", "function": {"name": "book", "parameters": SCHEMAS["booking"]}},
    {"type": "function", "function": {"name": "ping"}},  # (no parameters: arguments are {})
]


@pytest.fixture(scope="module")
def engine():
    return omni()


def request(i: int, sampled: bool, max_tokens: int = 400, **fields) -> dict:
    return {
        "messages": [{"role": "user", "content": f"answer number {i}"}],
        "max_tokens": max_tokens,
        "temperature": 1.0 if sampled else 0.0,
        "seed": i,
        **fields,
    }


def schema_request(i: int, name: str, sampled: bool) -> dict:
    fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}
    return request(i, sampled, response_format=fmt)


@pytest.mark.parametrize("greedy_first", [True, False])
def test_every_schema_validates_greedy_and_sampled_concurrently(engine, greedy_first):
    """All 44 schemas in one concurrent batch, half greedy and half sampled; the second run swaps
    the halves, so each schema is decoded both ways."""
    names = list(SCHEMAS)
    assert len(names) >= 40
    reqs = [schema_request(i, name, sampled=(i % 2 == 0) != greedy_first) for i, name in enumerate(names)]
    outs = engine.generate(reqs)
    for name, out in zip(names, outs, strict=True):
        assert out.finish_reason == "stop", (name, out.finish_reason, out.error, out.text)
        jsonschema.validate(json.loads(out.text), SCHEMAS[name])


def test_json_object_regex_choice_and_gbnf(engine):
    regex = r"[a-z]{2,5}-[0-9]{3}"
    gbnf = 'root ::= "(" num ("+" num)* ")"\nnum ::= [0-9]'
    fields = [
        {"response_format": {"type": "json_object"}},
        {"structured_outputs": {"regex": regex}},
        {"structured_outputs": {"choice": ["red", "green", "blue"]}},
        {"structured_outputs": {"grammar": gbnf}},
        {"structured_outputs": {"grammar": 'start: "yes" | "no" | "maybe"'}},  # (Lark)
    ]
    reqs = [request(i, sampled, 200, **f) for i, f in enumerate(fields) for sampled in (False, True)]
    outs = engine.generate(reqs)
    assert all(o.finish_reason == "stop" for o in outs), [(o.finish_reason, o.error) for o in outs]
    texts = [o.text for o in outs]
    for text in texts[0:2]:
        assert isinstance(json.loads(text), dict)
    for text in texts[2:4]:
        assert re.fullmatch(regex, text)
    for text in texts[4:6]:
        assert text in ("red", "green", "blue")
    for text in texts[6:8]:
        assert re.fullmatch(r"\([0-9](\+[0-9])*\)", text)
    for text in texts[8:10]:
        assert text in ("yes", "no", "maybe")


def _parameters(name: str) -> dict:
    function = next(t["function"] for t in TOOLS if t["function"]["name"] == name)
    return function.get("parameters", {"type": "object", "properties": {}, "additionalProperties": False})


@pytest.mark.parametrize("parallel", [True, False])
def test_required_and_named_tool_calls_parse_and_validate(engine, parallel):
    named = {"type": "function", "function": {"name": "book"}}
    fields = {"tools": TOOLS, "parallel_tool_calls": parallel}
    max_tokens = 100 * MAX_TOOL_CALLS if parallel else 200  # (a call of these functions: under 100 tokens)
    choices = [("required", False), ("required", True), (named, False), (named, True)] + [("required", True)] * 6
    reqs = [request(i, s, max_tokens, tool_choice=c, **fields) for i, (c, s) in enumerate(choices)]
    for req, out in zip(reqs, engine.generate(reqs), strict=True):
        assert out.finish_reason == "stop", (out.error, out.text)
        content, calls = parse_tool_calls(out.text)
        assert content is None and calls, out.text
        assert len(calls) <= (MAX_TOOL_CALLS if parallel else 1)
        for call in calls:
            if isinstance(req["tool_choice"], dict):
                assert call.name == "book"
            jsonschema.validate(json.loads(call.arguments), _parameters(call.name))


def test_a_format_beside_tools_the_model_may_call(engine):
    """tool_choice "auto" beside a JSON Schema: each answer is calls (whose arguments validate) or a document
    of the schema; "required" beside it: calls only (the format has no text to apply to)."""
    fmt = {"type": "json_schema", "json_schema": {"name": "slot", "schema": SCHEMAS["calendar_slot"]}}
    reqs = [request(i, True, 1600, tools=TOOLS, response_format=fmt) for i in range(8)]
    reqs += [request(20, True, 1600, tools=TOOLS, tool_choice="required", response_format=fmt)]
    kinds = []
    for out in engine.generate(reqs):
        assert out.finish_reason == "stop", (out.error, out.text)
        content, calls = parse_tool_calls(out.text)
        kinds.append("calls" if calls else "document")
        if calls:
            assert content is None
            for call in calls:
                jsonschema.validate(json.loads(call.arguments), _parameters(call.name))
        else:
            jsonschema.validate(json.loads(out.text), SCHEMAS["calendar_slot"])
    assert kinds[-1] == "calls"


def test_unconstrained_ids_are_the_same_beside_constrained_ones(engine):
    """Greedy and sampled free requests, alone and then in a batch with constrained ones."""
    free = [request(100, False, 24, ignore_eos=True), request(101, True, 24, ignore_eos=True)]
    alone = [o.token_ids for o in engine.generate(free)]
    mixed = free[:1] + [schema_request(i, n, i % 2 == 1) for i, n in enumerate(["recipe", "booking"])] + free[1:]
    mixed += [request(102, True, 30, structured_outputs={"regex": "[a-z ]{1,40}"})]
    outs = engine.generate(mixed)
    assert [outs[0].token_ids, outs[3].token_ids] == alone


def test_bad_grammars_name_the_field(engine):
    cases = [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}}}, "not"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}}, ""),
        ({"structured_outputs": {"regex": "[a-"}}, "regex"),
        ({"structured_outputs": {"choice": []}}, ""),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, ""),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "nope"),
        ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}}, "both"),
        ({"tools": TOOLS, "structured_outputs": {"grammar": 'root ::= "a"'}}, "tool_choice"),
        ({"response_format": {"type": "json_object"}, "min_tokens": 3}, "min_tokens"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "strin"}}}]}, "strin"),
    ]
    params = []
    for fields, word in cases:
        with pytest.raises(InvalidRequestError) as e:
            engine.add(request(0, False, **fields))
        assert word in str(e.value)
        params.append(e.value.param)
    assert params == [
        "response_format.json_schema.schema",
        "response_format.json_schema.schema",
        "structured_outputs.regex",
        "structured_outputs.choice",
        "structured_outputs",
        "tool_choice",
        "structured_outputs",
        "structured_outputs.grammar",
        "min_tokens",
        "tools[0].function.parameters",
    ]
    assert not engine.engine.has_unfinished()


def test_a_grammar_the_engine_cannot_compile_fails_its_request_alone(engine):
    """A Lark grammar naming a token the vocabulary lacks passes the tokenizer-free check and fails
    to compile in the engine: that request ends in an error, its neighbour is untouched."""
    bad = request(0, False, 20, structured_outputs={"grammar": "start: <no_such_token>"})
    good = request(1, False, 20, ignore_eos=True)
    alone = engine.generate(dict(good)).token_ids
    outs = engine.generate([bad, good])
    assert outs[0].finish_reason == "error" and "no_such_token" in outs[0].error
    assert outs[1].finish_reason == "length" and outs[1].token_ids == alone
    assert not engine.engine.has_unfinished()
