"""OpenAI's Responses API (``/v1/responses``) as a chat completion underneath.

A Responses body becomes a chat body (``chat_body``) that ``openai_api.chat_request`` turns into the
engine request, as for ``/v1/chat/completions``: one path for prompts, media, tools and grammars.

    Responses                                   chat
    instructions                                a system message first
    previous_response_id                        that response's conversation (its input and output)
    input: a string                             a user message
    message items (input_text / output_text,    messages (text, image_url, input_audio parts)
      input_image, input_audio parts)
    function_call items                         an assistant message's tool_calls (consecutive ones merged)
    function_call_output items                  tool messages
    tools: {"type": "function", name, ...}      tools: {"type": "function", "function": {name, ...}}
    tool_choice: {"type": "function", name}     tool_choice: {"type": "function", "function": {name}}
    text.format: {type, name, schema, strict}   response_format (json_schema: {name, schema, strict})
    max_output_tokens                           max_completion_tokens

The answer is read back into output items by ``response_body``. A chat-side 400 names the Responses
field (``response_format.json_schema.schema`` -> ``text.format.schema``, ``messages[3].content[0]``
-> ``input[2].content[0]``: ``param_name``).
"""

from __future__ import annotations

import re
import uuid

from pydantic import TypeAdapter, ValidationError

from omniwalk.serve import responses_schemas as rs
from omniwalk.serve.errors import APIError, bad_request, unsupported, validation_error
from omniwalk.serve.response_body import Turn
from omniwalk.serve.response_store import ResponseStore

ITEMS = TypeAdapter(list[rs.Item])
# chat fields a Responses body sets under the same name
SAME_NAME = ("model", "stream", "temperature", "top_p", "parallel_tool_calls")
SAME_NAME += ("seed", "top_k", "repetition_penalty", "min_tokens", "ignore_eos", "stop")
# OpenAI features this server does not have (a 400 that says so when one is set)
UNSUPPORTED = {
    "background": "background mode",
    "reasoning": "reasoning",
    "conversation": "conversations",
    "prompt": "prompt templates",
    "max_tool_calls": "max_tool_calls",
    "top_logprobs": "top_logprobs",
    "context_management": "context management",
}
# chat field names in a param or an error's message -> the Responses ones (after ``messages[i]`` is resolved)
PARAM_NAMES = (
    (re.compile(r"\bresponse_format(\.json_schema)?"), "text.format"),
    (re.compile(r"\btools\[(\d+)\]\.function"), r"tools[\1]"),
    (re.compile(r"\btool_choice\.function"), "tool_choice"),
    (re.compile(r"\bmax_(completion_)?tokens"), "max_output_tokens"),
    # (errors.validation_error drops a part's "input_audio", taking it for a union tag)
    (re.compile(r"(content\[\d+\])\.(data|format)$"), r"\1.input_audio.\2"),
)


def turn_of(body: rs.ResponsesRequest, store: ResponseStore, family_fields) -> Turn:
    """A validated Responses body -> its ``Turn``; APIError when it cannot be served."""
    for name, what in UNSUPPORTED.items():
        value = getattr(body, name)
        if value not in (False, 0) and not _is_empty(value):
            raise unsupported(name, what)
    history = []
    if body.previous_response_id is not None:
        previous = store.get(body.previous_response_id)
        if previous is None:
            message = f"Previous response with id '{body.previous_response_id}' not found."
            raise APIError(400, message, param="previous_response_id", code="previous_response_not_found")
        history = previous.items
    given = [{"role": "user", "content": body.input}] if isinstance(body.input, str) else list(map(_plain, body.input))
    messages, sources = [], []
    if body.instructions is not None:
        messages, sources = [{"role": "system", "content": body.instructions}], ["instructions"]
    for items, where in ((history, "previous_response_id"), (given, "input")):
        more, origins = chat_messages(ITEMS.validate_python(items), where)
        messages, sources = messages + more, sources + origins
    chat = {name: getattr(body, name) for name in (*SAME_NAME, *family_fields) if getattr(body, name) is not None}
    chat.update(messages=messages, max_completion_tokens=body.max_output_tokens, **structured(body))
    chat = {k: v for k, v in chat.items() if v is not None}
    return Turn(
        id=f"resp_{uuid.uuid4().hex}",
        chat=chat,
        sources=sources,
        items=history + given,
        echo=echo(body),
        store=body.store is not False,
    )


def _is_empty(value) -> bool:
    """None, an empty list, or an object whose fields are all unset (``"reasoning": {"effort": null}``)."""
    if isinstance(value, dict):
        return all(_is_empty(v) for v in value.values())
    return value is None or value == []


def structured(body: rs.ResponsesRequest) -> dict:
    """tools, tool_choice and text.format -> chat's tools, tool_choice and response_format."""
    out = {}
    for i, tool in enumerate(body.tools or []):
        if isinstance(tool, rs.Unsupported):
            raise unsupported(f"tools[{i}].type", f"{tool.type!r} tools (only function tools)")
        function = tool.model_dump(exclude_none=True, exclude={"type"})
        out.setdefault("tools", []).append({"type": "function", "function": function})
    choice = body.tool_choice
    if isinstance(choice, rs.Unsupported):
        raise unsupported("tool_choice.type", f"a tool_choice of type {choice.type!r}")
    if isinstance(choice, rs.FunctionChoice):
        choice = {"type": "function", "function": {"name": choice.name}}
    out["tool_choice"] = choice
    fmt = body.text.format if body.text is not None else None
    if fmt is not None and fmt.type == "json_schema":
        out["response_format"] = {"type": "json_schema", "json_schema": fmt.model_dump(by_alias=True, exclude={"type"})}
    elif fmt is not None:
        out["response_format"] = {"type": fmt.type}
    return out


def chat_messages(items: list, where: str) -> tuple[list[dict], list[str]]:
    """Input items -> (chat messages, the param each came from: ``where[i]``, or ``where`` itself
    for a stored conversation's items)."""
    messages, sources = [], []
    for i, item in enumerate(items):
        origin = f"{where}[{i}]" if where == "input" else where
        if isinstance(item, rs.Unsupported):
            raise unsupported(f"{origin}.type", f"{item.type!r} input items")
        if isinstance(item, rs.FunctionCall):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            if messages and messages[-1]["role"] == "assistant":  # (one turn's message and calls: one chat turn)
                messages[-1].setdefault("tool_calls", []).append(call)
                continue
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
        elif isinstance(item, rs.FunctionCallOutput):
            message = {"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output, f"{origin}.output")}
        elif item.role == "user":
            message = {"role": "user", "content": _user_content(item.content, origin)}
        else:
            message = {"role": item.role, "content": _text(item.content, f"{origin}.content")}
        messages.append(message)
        sources.append(origin)
    return messages, sources


def _text(content: str | list, where: str) -> str:
    """Text-only content (instructions, assistant turns, function outputs) -> its text."""
    if isinstance(content, str):
        return content
    for j, part in enumerate(content):
        if not isinstance(part, rs.InputText | rs.OutputText | rs.Refusal):
            raise bad_request(f"{where}[{j}]: only text parts are read here", f"{where}[{j}].type")
    return "".join(part.refusal if isinstance(part, rs.Refusal) else part.text for part in content)


def _user_content(content: str | list, where: str) -> str | list[dict]:
    if isinstance(content, str):
        return content
    parts = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        if isinstance(part, rs.InputText | rs.OutputText):
            parts.append({"type": "text", "text": part.text})
        elif isinstance(part, rs.InputImage):
            if part.image_url is None:
                raise unsupported(f"{at}.file_id", "images by file id (there is no Files API: send image_url)")
            detail = {"detail": part.detail} if part.detail in ("auto", "low", "high") else {}
            parts.append({"type": "image_url", "image_url": {"url": part.image_url, **detail}})
        elif isinstance(part, rs.InputAudio):
            parts.append({"type": "input_audio", "input_audio": part.input_audio.model_dump(exclude_none=True)})
        else:
            raise unsupported(f"{at}.type", f"{part.type!r} content parts")
    return parts


def echo(body: rs.ResponsesRequest) -> dict:
    """The Response fields that repeat the request."""
    fmt = body.text.format if body.text is not None and body.text.format is not None else None
    return {
        "model": body.model,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "metadata": body.metadata or {},
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "store": body.store is not False,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}},
        "tool_choice": _plain(body.tool_choice) or "auto",
        "tools": [_plain(tool) for tool in body.tools or []],
        "truncation": body.truncation or "disabled",
        "background": False,
        "reasoning": None,
        "user": body.user,
    }


def _plain(value):
    return value.model_dump(by_alias=True, exclude_none=True) if hasattr(value, "model_dump") else value


def chat_of(turn: Turn, chat_schema) -> object:
    """The turn's chat body, validated as ``/v1/chat/completions`` validates one."""
    try:
        return chat_schema.model_validate(turn.chat)
    except ValidationError as e:
        raise validation_error(e) from None


def param_name(param: str | None, sources: list[str]) -> str | None:
    """A chat param -> the Responses field it came from."""
    if param is None:
        return None
    found = re.match(r"^messages\[(\d+)\](.*)$", param)
    if found:
        origin, rest = sources[int(found[1])], found[2]
        if not origin.startswith("input[") or not rest.startswith(".content["):
            return origin  # (a stored conversation's, or a whole item's: a tool call, a function output)
        param = origin + rest
    for pattern, name in PARAM_NAMES:
        param = pattern.sub(name, param)
    return param


def renamed(e: APIError, sources: list[str]) -> APIError:
    """``e`` with its param named as the Responses body names it (in its message too)."""
    param, message = param_name(e.param, sources), str(e)
    if e.param is not None:
        message = message.replace(e.param, param, 1)
    for pattern, name in PARAM_NAMES[:-1]:
        message = pattern.sub(name, message)
    return APIError(e.status, message, param=param, code=e.code, headers=e.headers)
