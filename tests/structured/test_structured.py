"""Constrained decoding on the tiny Qwen3-Omni (random weights, CPU): every output follows its grammar.

With random weights a valid output is the grammar's doing alone. The 44 schemas of the bench's corpus
run concurrently (one batch of 44: past 32 at once), greedy and sampled, and each output validates
with ``jsonschema``; json_object, regex, choice and GBNF outputs are checked by their own rules;
required and named tool calls parse and their arguments validate against the function's parameters.
An unconstrained request's ids are the same beside constrained ones as alone, bit for bit.

The tool-call parser on scripted model outputs: expected calls and content written out by hand, the
same results for any split of the text into streamed pieces, strict JSON as Python's json module reads
it, and the OpenAI shapes (a client accumulating the streamed deltas gets the non-streamed tool_calls)."""

import json
import random
import re

import jsonschema
import pytest
from helpers.qwen3_omni import omni

from omniwalk.bench.schemas import SCHEMAS
from omniwalk.errors import InvalidRequestError
from omniwalk.structured.grammars import MAX_TOOL_CALLS
from omniwalk.structured.tools import (
    TOOL_CALL_START,
    Arguments,
    CallStart,
    Content,
    ToolCallStream,
    delta_tool_calls,
    openai_tool_calls,
    parse_tool_calls,
)

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


@pytest.mark.filterwarnings("ignore::UserWarning")
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


@pytest.mark.filterwarnings("ignore::UserWarning")
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


@pytest.mark.filterwarnings("ignore::UserWarning")
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


@pytest.mark.filterwarnings("ignore::UserWarning")
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


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_unconstrained_ids_are_the_same_beside_constrained_ones(engine):
    """Greedy and sampled free requests, alone and then in a batch with constrained ones."""
    free = [request(100, False, 24, ignore_eos=True), request(101, True, 24, ignore_eos=True)]
    alone = [o.token_ids for o in engine.generate(free)]
    mixed = free[:1] + [schema_request(i, n, i % 2 == 1) for i, n in enumerate(["recipe", "booking"])] + free[1:]
    mixed += [request(102, True, 30, structured_outputs={"regex": "[a-z ]{1,40}"})]
    outs = engine.generate(mixed)
    assert [outs[0].token_ids, outs[3].token_ids] == alone


@pytest.mark.filterwarnings("ignore::UserWarning")
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


@pytest.mark.filterwarnings("ignore::UserWarning")
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


def block(obj: str, before: str = "\n", after: str = "\n") -> str:
    return f"<tool_call>{before}{obj}{after}</tool_call>"


def call_json(name: str, arguments: str) -> str:
    return f'{{"name": {json.dumps(name)}, "arguments": {arguments}}}'


WEATHER = '{"city": "Paris"}'
TRICKY = json.dumps(
    {
        "q": "a } b ] c {",
        "tags": "</tool_call>\n<tool_call>!",
        "quote": 'say "hi" \\ then',
        "nested": {"list": [1, -2.5e3, True, None, {"x": [], "y": {}}], "s": "}}"},
    }
)
UNICODE = json.dumps({"city": "Zürich", "sky": "🌧️", "jp": "東京"}, ensure_ascii=False)
UNICODE_ESCAPED = json.dumps({"city": "Zürich", "sky": "🌧️"})  # \u escapes, a surrogate pair
INDENTED = json.dumps({"a": [1, {"b": "c"}], "d": None}, indent=2)
BAD_CALL = block('{"name": "f", "arguments": {"a": 1}')  # a brace short

# name -> (model output, expected content, expected [(name, arguments)])
CASES = {
    "no call": ("The weather is fine.", "The weather is fine.", []),
    "one call": (block(call_json("get_weather", WEATHER)), None, [("get_weather", WEATHER)]),
    "text, two calls, text": (
        "Let me check both.\n"
        + block(call_json("get_weather", WEATHER))
        + "\n"
        + block(call_json("get_time", '{"tz": "CET"}'))
        + "\nDone.",
        "Let me check both.\n\n\nDone.",
        [("get_weather", WEATHER), ("get_time", '{"tz": "CET"}')],
    ),
    "tags and braces inside strings": (block(call_json("search", TRICKY)), None, [("search", TRICKY)]),
    "unicode": (
        "Voilà 🙂 " + block(call_json("météo", UNICODE)) + block(call_json("m", UNICODE_ESCAPED)),
        "Voilà 🙂",
        [("météo", UNICODE), ("m", UNICODE_ESCAPED)],
    ),
    "whitespace variants": (
        block('{"name":"a","arguments":{"x":1}}', before="", after="")
        + block(f'{{\n  "name": "b",\n  "arguments": {INDENTED}\n}}', before="\n\n  ", after=" \t\r\n")
        + block('{ "name" : "c" , "arguments" : [ 1 , 2 ] }', before="\r\n", after=""),
        None,
        [("a", '{"x":1}'), ("b", INDENTED), ("c", "[ 1 , 2 ]")],
    ),
    "scalar arguments": (
        block(call_json("s", '"text } ]"'))
        + block('{"name": "n", "arguments": -0.5e-3}')
        + block('{"name": "t", "arguments":true }')
        + block('{"name": "z", "arguments": null, "extra": 1}'),
        None,
        [("s", '"text } ]"'), ("n", "-0.5e-3"), ("t", "true"), ("z", "null")],
    ),
    "no arguments": (block('{"name": "now"}'), None, [("now", "{}")]),
    "arguments before the name, other keys": (
        block('{"arguments": {"a": 1}, "id": 7, "name": "f"}'),
        None,
        [("f", '{"a": 1}')],
    ),
    "bad json": (
        "Hi " + block('{"name": "f", "arguments": {"a": }}') + " bye",
        "Hi " + block('{"name": "f", "arguments": {"a": }}') + " bye",
        [],
    ),
    "no name": (block('{"arguments": {}}'), block('{"arguments": {}}'), []),
    "name not a string": (block('{"name": 3}'), block('{"name": 3}'), []),
    "empty name": (block('{"name": ""}'), block('{"name": ""}'), []),
    "two names": (block('{"name": "f", "name": "g"}'), block('{"name": "f", "name": "g"}'), []),
    "two arguments": (
        block('{"name": "f", "arguments": 1, "arguments": 2}'),
        block('{"name": "f", "arguments": 1, "arguments": 2}'),
        [],
    ),
    "NaN is not JSON": (
        block('{"name": "f", "arguments": {"x": NaN}}'),
        block('{"name": "f", "arguments": {"x": NaN}}'),
        [],
    ),
    "not an object": (block('["f", {}]'), block('["f", {}]'), []),
    "text inside the tags": (
        block('{"name": "f", "arguments": {}} and more'),
        block('{"name": "f", "arguments": {}} and more'),
        [],
    ),
    "space inside the end tag": (
        '<tool_call>{"name": "f"}\n</ tool_call>',
        '<tool_call>{"name": "f"}\n</ tool_call>',
        [],
    ),
    "unterminated": (
        'Sure: <tool_call>\n{"name": "f", "arguments": {"a": 1}}',
        'Sure: <tool_call>\n{"name": "f", "arguments": {"a": 1}}',
        [],
    ),
    "cut inside the end tag": (
        '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_ca',
        '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_ca',
        [],
    ),
    "a bad call, then a good one": (
        BAD_CALL + "\n" + block(call_json("g", "{}")),
        BAD_CALL,
        [("g", "{}")],
    ),
    "an unclosed string swallows the end tag": (
        '<tool_call>{"name": "a", "arguments": "x</tool_call>\n' + block(call_json("b", "[]")),
        '<tool_call>{"name": "a", "arguments": "x</tool_call>',
        [("b", "[]")],
    ),
    "a call inside a broken one": (
        '<tool_call>{"name": "f", oops ' + block(call_json("g", "{}")),
        '<tool_call>{"name": "f", oops',
        [("g", "{}")],
    ),
    "tags in prose": (
        "Use <tool_call> tags; </tool_call> closes one. Wait <tool_ca",
        "Use <tool_call> tags; </tool_call> closes one. Wait <tool_ca",
        [],
    ),
}
WELL_FORMED = {"one call", "text, two calls, text", "tags and braces inside strings", "unicode", "whitespace variants"}
WELL_FORMED |= {"scalar arguments", "no arguments", "arguments before the name, other keys"}


def splits(text: str, rng: random.Random) -> list[str]:
    pieces, i = [], 0
    while i < len(text):
        n = rng.choice([1, 1, 2, 3, 5, 8, 13])
        pieces.append(text[i : i + n])
        i += n
    return pieces


def stream(pieces: list[str]) -> tuple[list, list]:
    parser = ToolCallStream()
    out = [piece for text in pieces for piece in parser.feed(text)] + parser.finish()
    return out, parser.calls


def content_of(pieces: list) -> str:
    return "".join(piece.text for piece in pieces if isinstance(piece, Content))


def arguments_by_id(pieces: list) -> dict[str, str]:
    ids = {piece.index: piece.id for piece in pieces if isinstance(piece, CallStart)}
    streamed = dict.fromkeys(ids.values(), "")
    for piece in pieces:
        if isinstance(piece, Arguments):
            streamed[ids[piece.index]] += piece.text
    return streamed


@pytest.mark.parametrize("name", CASES)
def test_parse_tool_calls_on_scripted_outputs(name):
    text, content, expected = CASES[name]
    got_content, calls = parse_tool_calls(text)
    assert got_content == content
    assert [(call.name, call.arguments) for call in calls] == expected
    for call in calls:
        json.loads(call.arguments)
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", call.id) for call in calls)
    assert len({call.id for call in calls}) == len(calls)


@pytest.mark.parametrize("name", CASES)
def test_any_split_streams_the_same_content_and_calls(name):
    text, content, expected = CASES[name]
    whole, _ = stream([text])
    rng = random.Random(name)
    for pieces in [list(text)] + [splits(text, rng) for _ in range(30)]:
        out, calls = stream(pieces)
        assert content_of(out) == content_of(whole)
        assert (content_of(out).strip() or None) == content
        assert [(call.name, call.arguments) for call in calls] == expected
        streamed = arguments_by_id(out)
        assert all(streamed[call.id] == call.arguments for call in calls)
        starts = [piece for piece in out if isinstance(piece, CallStart)]
        assert [start.index for start in starts] == list(range(len(starts)))
        if name in WELL_FORMED:
            assert [(start.id, start.name) for start in starts] == [(call.id, call.name) for call in calls]


def test_content_is_held_only_while_it_may_start_a_call():
    parser = ToolCallStream()
    assert parser.feed("x <to") == [Content("x ")]
    assert parser.feed("ol") == []
    assert parser.feed("!") == [Content("<tool!")]
    assert parser.feed("a<") == [Content("a")]
    assert parser.finish() == [Content("<")]


def test_arguments_stream_as_they_arrive():
    parser = ToolCallStream()
    first = parser.feed('Hi\n<tool_call>\n{"name": "f", "arguments": {"city": "Par')
    assert first[0] == Content("Hi\n")
    assert first[1:] == [CallStart(index=0, id=first[1].id, name="f"), Arguments(index=0, text='{"city": "Par')]
    assert parser.feed('is"}') == [Arguments(index=0, text='is"}')]
    assert parser.feed(', "x": 1}\n</tool_') == []
    assert parser.calls == []
    assert parser.feed("call>ok") == [Content("ok")]
    assert [(call.id, call.arguments) for call in parser.calls] == [(first[1].id, '{"city": "Paris"}')]


def test_a_number_argument_ends_at_its_delimiter():
    parser = ToolCallStream()
    assert parser.feed('<tool_call>{"name": "f') == []
    (start,) = parser.feed('"')
    assert start == CallStart(index=0, id=start.id, name="f")
    assert parser.feed(', "arguments": 12') == [Arguments(index=0, text="12")]
    assert parser.feed(" }\n") == []
    assert parser.feed("</tool_call>") == []
    assert [(call.name, call.arguments) for call in parser.calls] == [("f", "12")]


def test_arguments_written_before_the_name_follow_the_call_start():
    parser = ToolCallStream()
    assert parser.feed('<tool_call>{"arguments": {"a": 1}, ') == []
    start, arguments = parser.feed('"name": "f"')
    assert (start.name, arguments) == ("f", Arguments(index=0, text='{"a": 1}'))


def test_a_started_call_cut_off_is_dropped_and_its_text_becomes_content():
    text = 'Ok <tool_call>{"name": "f", "arguments": {"a": 1'
    parser = ToolCallStream()
    pieces = parser.feed(text)
    assert [type(piece) for piece in pieces] == [Content, CallStart, Arguments]
    assert parser.finish() == [Content(TOOL_CALL_START), Content(text.removeprefix("Ok <tool_call>"))]
    assert parser.calls == []
    assert parse_tool_calls(text) == (text, [])


class Pairs(list):
    """A JSON object as Python's json reads it, keys in order and repeated keys kept."""


def _reference_call(obj: str) -> tuple[str, object] | None:
    """What Python's json reads in a call's object text: (name, arguments) or None if not a call."""

    def reject(constant):
        raise ValueError(constant)

    try:
        root = json.loads(obj, object_pairs_hook=Pairs, parse_constant=reject)
    except ValueError:
        return None
    if not isinstance(root, Pairs):
        return None
    keys = [key for key, _ in root]
    name = dict(root).get("name")
    if keys.count("name") != 1 or keys.count("arguments") > 1 or not isinstance(name, str) or not name:
        return None
    return name, dict(root).get("arguments", Pairs())


STRINGS = ["", "plain", "a } b ] c", 'say "hi"', "back\\slash", "tab\tnew\nline\x01", "</tool_call>", "<tool_call>!"]
STRINGS += ["Zürich 東京 🌧️"]


def random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(7 if depth < 3 else 4)
    if kind == 0:
        return rng.choice(STRINGS)
    if kind == 1:
        return rng.choice([0, -7, 123456789, 2.5, -1e-9, 6.02e23, 1e300])
    if kind == 2:
        return rng.choice([True, False, None])
    if kind == 3:
        return rng.choice(STRINGS) + str(rng.randrange(100))
    if kind == 4:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(STRINGS): random_value(rng, depth + 1) for _ in range(rng.randrange(4))}


def mutate(text: str, rng: random.Random) -> str:
    for _ in range(rng.randrange(1, 3)):
        i = rng.randrange(len(text) + 1)
        char = rng.choice('{}[]:,"\\ \n0123456789-+.eEtrufalsnx')
        text = rng.choice([text[:i] + char + text[i:], text[:i] + text[i + 1 :], text[:i] + char + text[i + 1 :]])
    return text


def test_calls_are_read_as_python_json_reads_them():
    rng = random.Random(0)
    num_calls = num_rejected = 0
    for _ in range(1500):
        separators = rng.choice([(", ", ": "), (",", ":"), (" , ", " : ")])
        members = {"name": rng.choice(["f", "get_weather", "météo"]), "arguments": random_value(rng)}
        if rng.random() < 0.3:
            members = dict(reversed(members.items()))
        obj = json.dumps(members, separators=separators, indent=rng.choice([None, 2]), ensure_ascii=rng.random() < 0.5)
        if rng.random() < 0.6:
            obj = mutate(obj, rng)
        text = block(obj)
        reference = _reference_call(obj)
        content, calls = parse_tool_calls(text)
        if reference is None:
            assert (content, calls) == (text, []), obj
            num_rejected += 1
            continue
        (call,) = calls
        assert content is None
        assert call.name == reference[0]
        assert json.loads(call.arguments, object_pairs_hook=Pairs) == reference[1]
        assert call.arguments == call.arguments.strip()
        assert call.arguments in obj if '"arguments"' in obj else call.arguments == "{}"
        out, streamed_calls = stream(splits(text, rng))
        assert content_of(out) == "" and [(c.name, c.arguments) for c in streamed_calls] == [
            (call.name, call.arguments)
        ]
        num_calls += 1
    assert num_calls > 400 and num_rejected > 400


def test_openai_shapes():
    text = "Checking.\n" + block(call_json("get_weather", WEATHER)) + "\n" + block('{"name": "now"}')
    _, calls = parse_tool_calls(text)
    assert openai_tool_calls(calls) == [
        {"id": calls[0].id, "type": "function", "function": {"name": "get_weather", "arguments": WEATHER}},
        {"id": calls[1].id, "type": "function", "function": {"name": "now", "arguments": "{}"}},
    ]
    start, arguments = CallStart(index=1, id="call_" + "0" * 24, name="f"), Arguments(index=1, text='{"a"')
    assert delta_tool_calls(start) == {
        "index": 1,
        "id": start.id,
        "type": "function",
        "function": {"name": "f", "arguments": ""},
    }
    assert delta_tool_calls(arguments) == {"index": 1, "function": {"arguments": '{"a"'}}
    with pytest.raises(TypeError):
        delta_tool_calls(Content("x"))


@pytest.mark.parametrize("name", sorted(WELL_FORMED))
def test_streamed_deltas_accumulate_to_the_message_tool_calls(name):
    """A client appends each delta's function.arguments by index, as the OpenAI SDK does."""
    text = CASES[name][0]
    out, calls = stream(splits(text, random.Random(1)))
    accumulated: dict[int, dict] = {}
    for piece in out:
        if isinstance(piece, Content):
            continue
        delta = delta_tool_calls(piece)
        entry = accumulated.setdefault(delta["index"], {"function": {"arguments": ""}})
        if "id" in delta:
            entry.update(id=delta["id"], type=delta["type"])
            entry["function"]["name"] = delta["function"]["name"]
        entry["function"]["arguments"] += delta["function"]["arguments"]
    assert [accumulated[i] for i in sorted(accumulated)] == openai_tool_calls(calls)
