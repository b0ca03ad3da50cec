"""Tools over the Realtime API: realtime's flat function tools and ``tool_choice``, checked and
turned into chat completions' shapes (a response is a chat request: ``response.py``).

    realtime                                          chat
    {"type": "function", "name", "description",       {"type": "function", "function": {"name",
     "parameters"}                                      "description", "parameters"}}
    "auto" | "none" | "required"                      the same
    {"type": "function", "name"}                      {"type": "function", "function": {"name"}}

A session's tools serve every response; a ``response.create`` may bring its own (they replace the
session's for that response). The grammar engine checks the functions' parameters schemas as chat
does (``openai_api.check_grammar``: at ``session.update``, and when a response is built); its
errors name chat's fields (``tools[0].function.parameters``), which ``realtime_param`` turns back
into realtime's.
"""

from __future__ import annotations

import re

from omniwalk.serve import openai_api as api
from omniwalk.serve.errors import APIError, bad_request
from omniwalk.serve.realtime import protocol as p

ToolChoice = str | p.ToolChoiceFunction


def check_tools(tools: list[p.FunctionTool], choice: ToolChoice, where: str) -> None:
    """Names unique; a named ``tool_choice`` among them; ``required`` with some tool to call."""
    names: set[str] = set()
    for i, tool in enumerate(tools):
        if tool.name in names:
            raise bad_request(f"two tools are named {tool.name!r}", f"{where}.tools[{i}].name")
        names.add(tool.name)
    if isinstance(choice, p.ToolChoiceFunction) and choice.name not in names:
        known = ", ".join(sorted(names)) or "no tools"
        raise bad_request(f"tool_choice names {choice.name!r}, not one of the tools ({known})", f"{where}.tool_choice")
    if choice == "required" and not tools:
        raise bad_request("tool_choice 'required' needs tools to call", f"{where}.tool_choice")


def chat_tools(tools: list[p.FunctionTool]) -> list[dict]:
    return [{"type": "function", "function": tool.model_dump(exclude={"type"}, exclude_none=True)} for tool in tools]


def chat_tool_choice(choice: ToolChoice) -> str | dict:
    if isinstance(choice, p.ToolChoiceFunction):
        return {"type": "function", "function": {"name": choice.name}}
    return choice


def tools_json(tools: list[p.FunctionTool]) -> list[dict]:
    """A session's tools as ``session.created`` / ``updated`` show them."""
    return [{"type": "function", **tool.model_dump(exclude={"type"}, exclude_none=True)} for tool in tools]


def tool_choice_json(choice: ToolChoice) -> str | dict:
    return choice.model_dump() if isinstance(choice, p.ToolChoiceFunction) else choice


CHAT_TOOL_PARAM = re.compile(r"^tools(\[\d+\])?(?:\.function)?(.*)$")


async def check_tool_grammar(tools: list[p.FunctionTool], choice: ToolChoice, where: str, timeout_s: float) -> None:
    """What chat checks of tools (the grammar engine compiles the parameters schemas a forced call
    must follow), at ``session.update`` rather than at each response; errors name realtime's fields."""
    try:
        await api.check_grammar({"tools": chat_tools(tools), "tool_choice": chat_tool_choice(choice)}, timeout_s)
    except APIError as e:
        raise realtime_param(e, where, where) from None


def realtime_param(e: APIError, tools_where: str, choice_where: str) -> APIError:
    """An error naming a chat request's ``tools[i].function.x`` / ``tool_choice`` -> the same
    error naming realtime's ``{where}.tools[i].x`` / ``{where}.tool_choice``."""
    if e.param is None:
        return e
    match = CHAT_TOOL_PARAM.match(e.param)
    if match:
        e.param = f"{tools_where}.tools{match[1] or ''}{match[2]}"
    elif e.param == "tool_choice" or e.param.startswith("tool_choice."):
        e.param = f"{choice_where}.tool_choice"
    return e
