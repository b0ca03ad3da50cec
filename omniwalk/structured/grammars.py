"""What a request's output must follow: its fields -> one grammar for the grammar engine (llguidance).

The fields, as OpenAI and vLLM name them (plain dicts, as the engine request carries them):

    response_format      {"type": "json_object"} | {"type": "json_schema", "json_schema": {name, schema, strict}}
    structured_outputs   exactly one of {"json": schema, "regex": str, "choice": [str], "grammar": str}
                         (``grammar``: GBNF / EBNF as llama.cpp writes it, or Lark)
    tools + tool_choice  "required" or a named function: the output is Hermes-style calls, each
                         ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, whose
                         arguments follow that function's parameters (up to ``MAX_TOOL_CALLS``, one per
                         line, with ``parallel_tool_calls``); "auto" and "none" constrain nothing

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
# JSON compact and on one line: no whitespace a model could repeat without end
_JSON_OPTIONS = {"whitespace_flexible": False}
# the grammar engine's bounds on grammar size and lexer work (a grammar past them is refused, not run)
LIMITS = llguidance.LLParserLimits(max_grammar_size=500_000, initial_lexer_fuel=1_000_000, step_lexer_fuel=200_000)


@dataclass(frozen=True)
class Constraint:
    kind: str  # "json_object", "json_schema", "regex", "choice", "grammar" or "tool_calls"
    grammar: str  # the grammar engine's grammar (llguidance's JSON form)
    param: str  # the request field it came from


def constraint_of(request: dict) -> Constraint | None:
    """The grammar a request's output must follow, or None; InvalidRequestError (with ``param``) when
    a field is malformed, contradicts another or asks what the grammar engine cannot do."""
    found = [c for c in (_response_format(request), _structured_outputs(request), _tool_calls(request)) if c]
    if len(found) > 1:
        names = " and ".join(c.param for c in found)
        raise InvalidRequestError(f"{names} both constrain the output; send one of them", found[1].param)
    if not found:
        return None
    _validate(found[0])
    return found[0]


def _response_format(request: dict) -> Constraint | None:
    fmt = request.get("response_format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint(kind, _json_grammar({"type": "object"}, "response_format"), "response_format")
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
    schema = spec.get("schema", {})
    return Constraint(kind, _json_grammar(schema, param), param)


def _structured_outputs(request: dict) -> Constraint | None:
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
        return Constraint("json_schema", _json_grammar(value, param), param)
    if key == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise InvalidRequestError(f"{param} must be a non-empty list of non-empty strings", param)
        return Constraint("choice", llguidance.grammar_from("choice", value), param)
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"{param} must be a non-empty string", param)
    if key == "regex":
        return Constraint("regex", llguidance.LLMatcher.grammar_from_regex(value), param)
    try:
        return Constraint("grammar", llguidance.grammar_from("grammar", value), param)
    except ValueError as e:
        raise InvalidRequestError(f"{param}: {e}", param) from None


def _json_grammar(schema, param: str) -> str:
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    if not isinstance(schema, dict):
        raise InvalidRequestError(f"{param} must be a JSON Schema (an object)", param)
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_OPTIONS)
    except ValueError as e:
        raise InvalidRequestError(f"{param}: {e}", param) from None


# ---- tools ----


def check_tools(request: dict) -> list[dict]:
    """The request's function tools (validated; [] when none), and its tool_choice checked against them."""
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
        if parameters is not None:  # (checked whatever tool_choice: an "auto" answer may call it too)
            param = f"{where}.function.parameters"
            _validate(Constraint("json_schema", _json_grammar(parameters, param), param))
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


def _tool_calls(request: dict) -> Constraint | None:
    functions = forced_functions(request)
    if functions is None:
        return None
    call = {"anyOf": [_call_schema(f) for f in functions], "x-guidance": _JSON_OPTIONS}
    # (the tags are single tokens of the vocabulary, named as such: the grammar engine keeps added
    # tokens apart from text that spells them)
    several = request.get("parallel_tool_calls", True) is not False
    calls = f'call ("\\n" call){{0,{MAX_TOOL_CALLS - 1}}}' if several else "call"
    lark = f'start: {calls}\ncall: {TOOL_CALL_START} "\\n" %json {json.dumps(call)} "\\n" {TOOL_CALL_END}\n'
    return Constraint("tool_calls", llguidance.LLMatcher.grammar_from_lark(lark), "tools")


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
        reason = messages[0] if messages else "invalid"
        raise InvalidRequestError(f"{constraint.param}: the grammar engine cannot use it: {reason}", constraint.param)
