"""The Response object of /v1/responses and its output items (OpenAI's shapes, as the `openai`
package's ``Response`` type has them).

An answer's text is an output ``message`` item (one ``output_text`` part) and, with tools, the text
outside the calls; each call is a ``function_call`` item ``{id, call_id, name, arguments, status}``.
``status`` is "completed", or "incomplete" with ``incomplete_details.reason`` "max_output_tokens"
when the engine stopped at the token limit.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from omniwalk.serve.response_store import ResponseStore
from omniwalk.structured.tools import parse_tool_calls


@dataclass
class Turn:
    """One /v1/responses request: the chat body it becomes, where each chat message came from (for
    error params), and the conversation a stored response keeps."""

    id: str
    chat: dict  # the chat body (plain JSON values)
    sources: list[str]  # per chat message: "instructions", "previous_response_id" or "input[i]"
    items: list[dict]  # the conversation's items: the previous response's, then this input's
    echo: dict  # the Response fields that repeat the request (tools, tool_choice, text, ...)
    store: bool
    created_at: int = field(default_factory=lambda: int(time.time()))

    def body(self, status: str, output: list[dict], **fields) -> dict:
        """The Response object."""
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": None,
            "output": output,
            "usage": None,
            **self.echo,
            **fields,
        }

    def finished(self, output: dict, items: list[dict]) -> dict:
        """The Response of a finished engine output whose output items are ``items``."""
        status = "incomplete" if output["finish_reason"] == "length" else "completed"
        fields = {"completed_at": int(time.time()), "usage": usage(output)}
        if status == "incomplete":
            fields["incomplete_details"] = {"reason": "max_output_tokens"}
        return self.body(status, items, **fields)

    def keep(self, store: ResponseStore, response: dict) -> None:
        """Store a finished response (unless the request said ``store: false``)."""
        if self.store:
            store.put(response, self.items + response["output"])


def usage(output: dict) -> dict:
    num_in, num_out = len(output["prompt_token_ids"]), len(output["token_ids"])
    return {
        "input_tokens": num_in,
        "input_tokens_details": {"cached_tokens": output["num_cached_tokens"], "cache_write_tokens": 0},
        "output_tokens": num_out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": num_in + num_out,
    }


def message_item(text: str, status: str) -> dict:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [part],
    }


def function_call_item(call_id: str, name: str, arguments: str, status: str) -> dict:
    item = {"id": f"fc_{uuid.uuid4().hex}", "type": "function_call", "call_id": call_id, "name": name}
    return {**item, "arguments": arguments, "status": status}


def output_items(output: dict, parses_tools: bool) -> list[dict]:
    """A whole answer -> its output items: the text as a message (when there is text, or no call),
    then its calls."""
    status = "incomplete" if output["finish_reason"] == "length" else "completed"
    content, calls = parse_tool_calls(output["text"]) if parses_tools else (output["text"], [])
    items = [message_item(content or "", status)] if content or not calls else []
    return items + [function_call_item(call.id, call.name, call.arguments, "completed") for call in calls]
