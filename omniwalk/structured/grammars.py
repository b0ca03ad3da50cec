"""What a request's output must follow: its fields -> one grammar for the grammar engine (llguidance).

The fields, as OpenAI and vLLM name them (plain dicts, as the engine request carries them):

    response_format      {"type": "json_object"} | {"type": "json_schema", "json_schema": {name, schema, strict}}
    structured_outputs   exactly one of {"json": schema, "regex": str, "choice": [str], "grammar": str}
                         (``grammar``: GBNF / EBNF as llama.cpp writes it, or Lark)
    tools + tool_choice  "required" or a named function: the output is Hermes-style calls, each
                         ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, whose
                         arguments follow that function's parameters (up to ``MAX_TOOL_CALLS``, one per
                         line, with ``parallel_tool_calls``); a text format beside it has nothing to apply to.
                         "auto" beside a format: calls, or text of that format; alone, nothing.
                         "none": the format alone, if any

``constraint_of`` is pure (no tokenizer) and validates what it builds, so the HTTP layer calls it
to answer a 400 naming the field before the engine sees the request (the engine calls it again:
it is cheap). The grammar engine names what it cannot do (e.g. ``Unimplemented keys: ["not"]``)
rather than ignoring it, so an output never silently breaks its schema. JSON comes out compact
(no free whitespace): a model cannot pad it forever.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import llguidance

from omniwalk.errors import InvalidRequestError

TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"
TOOL_CHOICES = ("none", "auto", "required")
# calls in one constrained answer at most (tool_choice "required" or named, with parallel_tool_calls): a
# bound no real turn reaches, so an answer of calls always ends (given bounded arguments)
MAX_TOOL_CALLS = 16
_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_STRUCTURED_KEYS = ("json", "regex", "choice", "grammar")
_UNESCAPED_SLASH = re.compile(r"(?<!\\)/")
_ENGINE_POSITION = re.compile(r"^at \d+\(\d+\): ")  # (where in our own Lark text: no use to the caller)
# JSON compact and on one line: no whitespace a model could repeat without end
_JSON_OPTIONS = {"whitespace_flexible": False}
# the grammar engine's bounds on grammar size and lexer work (a grammar past them is refused, not run)
LIMITS = llguidance.LLParserLimits(max_grammar_size=500_000, initial_lexer_fuel=1_000_000, step_lexer_fuel=200_000)


@dataclass(frozen=True)
class Constraint:
    kind: str  # "json_object", "json_schema", "regex", "choice", "grammar", "tool_calls" or "tool_calls_or_<kind>"
    grammar: str  # the grammar engine's grammar (Lark, as llguidance reads it)
    param: str  # the request field it came from


@dataclass(frozen=True)
class _Format:
    """What the text of an answer must be: one Lark expression (``rule``), or a whole grammar of its
    own (``grammar``: a user's Lark or GBNF, which does not combine with tool calls)."""

    kind: str
    param: str
    rule: str | None = None
    grammar: str | None = None


def constraint_of(request: dict) -> Constraint | None:
    """The grammar a request's output must follow, or None; InvalidRequestError (with ``param``) when
    a field is malformed, contradicts another or asks what the grammar engine cannot do.

    With tools: a required or named call makes the answer calls only (a text format has nothing to
    apply to); tools the model may call ("auto") beside a format make the answer either calls or
    text of that format; "none" leaves the format alone."""
    formats = [f for f in (_response_format(request), _structured_outputs(request)) if f]
    if len(formats) > 1:
        raise InvalidRequestError(
            "response_format and structured_outputs both constrain the output; send one of them", "structured_outputs"
        )
    fmt = formats[0] if formats else None
    functions = forced_functions(request)  # (also checks tools and tool_choice)
    may_call = bool(request.get("tools")) and request.get("tool_choice", "auto") == "auto"
    if functions is not None:
        constraint = Constraint("tool_calls", _grammar("start: calls", _calls_rules(functions, request)), "tools")
    elif fmt is None:
        return None
    elif may_call:
        if fmt.rule is None:
            raise InvalidRequestError(
                f"{fmt.param} does not combine with tools the model may call; send tool_choice 'none' or 'required'",
                fmt.param,
            )
        functions = [t["function"] for t in request["tools"]]
        rules = f"answer: {fmt.rule}\n{_calls_rules(functions, request)}"
        constraint = Constraint(f"tool_calls_or_{fmt.kind}", _grammar("start: calls | answer", rules), fmt.param)
    else:
        constraint = Constraint(fmt.kind, fmt.grammar or _grammar(f"start: {fmt.rule}"), fmt.param)
    _validate(constraint)
    return constraint


def _grammar(*lines: str) -> str:
    return llguidance.LLMatcher.grammar_from_lark("\n".join(lines) + "\n")


def _response_format(request: dict) -> _Format | None:
    fmt = request.get("response_format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return _Format(kind, "response_format", _json_rule({"type": "object"}, "response_format"))
    if kind != "json_schema":
        raise InvalidRequestError(
            f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}", "response_format.type"
        )
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise InvalidRequestError(
            "response_format.json_schema must be an object with a name (and a schema)", "response_format.json_schema"
        )
    param = "response_format.json_schema.schema"
    return _Format(kind, param, _json_rule(spec.get("schema", {}), param))


def _structured_outputs(request: dict) -> _Format | None:
    spec = request.get("structured_outputs")
    if spec is None:
        return None
    given = [k for k in _STRUCTURED_KEYS if isinstance(spec, dict) and spec.get(k) is not None]
    if len(given) != 1 or len(spec) != 1:
        raise InvalidRequestError(
            f"structured_outputs takes exactly one of {', '.join(_STRUCTURED_KEYS)}", "structured_outputs"
        )
    key = given[0]
    value, param = spec[key], f"structured_outputs.{key}"
    if key == "json":
        return _Format("json_schema", param, _json_rule(value, param))
    if key == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise InvalidRequestError(f"{param} must be a non-empty list of non-empty strings", param)
        return _Format("choice", param, " | ".join(json.dumps(c) for c in value))
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"{param} must be a non-empty string", param)
    if key == "regex":
        return _Format("regex", param, "/" + _UNESCAPED_SLASH.sub(r"\\/", value) + "/")
    try:
        return _Format("grammar", param, grammar=llguidance.grammar_from("grammar", value))
    except ValueError as e:
        raise InvalidRequestError(f"{param}: {e}", param) from None


def _json_rule(schema, param: str) -> str:
    """A JSON Schema as a Lark expression (compact JSON: no free whitespace)."""
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    if not isinstance(schema, dict):
        raise InvalidRequestError(f"{param} must be a JSON Schema (an object)", param)
    return f"%json {json.dumps({**schema, 'x-guidance': _JSON_OPTIONS})}"


# ---- tools ----


def check_tools(request: dict, schemas: bool = True) -> list[dict]:
    """The request's function tools (validated; [] when none), and its tool_choice checked against them.
    ``schemas``: also have the grammar engine check each ``parameters`` schema (~1 ms each; once a request)."""
    tools = request.get("tools") or []
    if not isinstance(tools, list):
        raise InvalidRequestError("tools must be a list", "tools")
    names = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
            raise InvalidRequestError(f'{where} must be {{"type": "function", "function": {{...}}}}', where)
        name = function.get("name")
        if not isinstance(name, str) or not _FUNCTION_NAME.fullmatch(name):
            raise InvalidRequestError(f"{where}.function.name must be 1-64 letters, digits, '_' or '-'", where)
        if name in names:
            raise InvalidRequestError(f"{where}.function.name {name!r} is declared twice", f"{where}.function.name")
        parameters = function.get("parameters")
        if parameters is not None and schemas:  # (whatever tool_choice: an "auto" answer may call it too)
            param = f"{where}.function.parameters"
            _validate(Constraint("json_schema", _grammar(f"start: {_json_rule(parameters, param)}"), param))
        names.append(name)
    choice = request.get("tool_choice")
    if choice is None or choice in TOOL_CHOICES:
        if choice == "required" and not tools:
            raise InvalidRequestError("tool_choice 'required' needs tools", "tool_choice")
        return tools
    named = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(named, str):
        raise InvalidRequestError(
            f'tool_choice must be one of {TOOL_CHOICES} or {{"type": "function", "function": {{"name": ...}}}}',
            "tool_choice",
        )
    if named not in names:
        known = ", ".join(names) or "none"
        raise InvalidRequestError(f"tool_choice names {named!r}, which is not among the tools ({known})", "tool_choice")
    return tools


def forced_functions(request: dict) -> list[dict] | None:
    """The functions one of which each call must name (tool_choice "required": all; named: that
    one), or None when the model may answer freely."""
    tools = check_tools(request)
    choice = request.get("tool_choice")
    if not tools or choice in (None, "auto", "none"):
        return None
    functions = [t["function"] for t in tools]
    return functions if choice == "required" else [f for f in functions if f["name"] == choice["function"]["name"]]


def _calls_rules(functions: list[dict], request: dict) -> str:
    """Lark rules ``calls`` (one call, or up to ``MAX_TOOL_CALLS`` one per line with
    ``parallel_tool_calls``) and ``call``: a call of one of ``functions``, its arguments following its parameters.
    (The tags are single tokens of the vocabulary, named as such: the grammar engine keeps added tokens apart
    from text that spells them.)"""
    call = {"anyOf": [_call_schema(f) for f in functions], "x-guidance": _JSON_OPTIONS}
    several = request.get("parallel_tool_calls", True) is not False
    calls = f'call ("\\n" call){{0,{MAX_TOOL_CALLS - 1}}}' if several else "call"
    return f'calls: {calls}\ncall: {TOOL_CALL_START} "\\n" %json {json.dumps(call)} "\\n" {TOOL_CALL_END}'


def _call_schema(function: dict) -> dict:
    """One call of ``function`` as the model writes it: {"name": <its name>, "arguments": <its parameters>}."""
    parameters = function.get("parameters") or {"type": "object", "properties": {}, "additionalProperties": False}
    return {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, "arguments": parameters},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _validate(constraint: Constraint) -> None:
    """The grammar engine's verdict on the grammar (schemas, regexes and grammars are checked here,
    within ``LIMITS``); a refusal names the field and the reason."""
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(constraint.grammar, None, limits=LIMITS)
    if is_error:
        reason = _ENGINE_POSITION.sub("", messages[0].splitlines()[0]) if messages else "invalid"
        raise InvalidRequestError(f"{constraint.param}: the grammar engine cannot use it: {reason}", constraint.param)
