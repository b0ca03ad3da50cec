"""A streamed /v1/responses answer: the server-sent events OpenAI's SDK parses
(``client.responses.stream``), each ``event: <type>`` with a JSON ``data`` carrying its
``sequence_number`` (0, 1, 2, ... in one response).

    response.created, response.in_progress            the Response, status "in_progress", no output
    per output item, in the order the text has them:
      message:        response.output_item.added, response.content_part.added (output_text),
                      response.output_text.delta ..., response.output_text.done,
                      response.content_part.done, response.output_item.done
      function_call:  response.output_item.added (arguments ""), response.function_call_arguments.delta ...,
                      response.function_call_arguments.done, response.output_item.done
    response.completed | response.incomplete (max_output_tokens) | response.failed (the engine failed)

The text goes through the chat path's ``ToolDeltas`` when the request has tools, so the items'
text and arguments are the non-streamed ones'. An answer with neither text nor calls still has its
(empty) message item. The final Response's ``output`` is the items as streamed.
"""

from __future__ import annotations

import json

from omniwalk.serve import response_body as rb
from omniwalk.serve.errors import APIError
from omniwalk.serve.response_store import ResponseStore
from omniwalk.serve.run import EngineRun
from omniwalk.serve.tool_responses import ToolDeltas
from omniwalk.serve.wire import Delta, Finished


class ResponseEvents:
    """One response's events, built from its text deltas."""

    def __init__(self, turn: rb.Turn, parses_tools: bool):
        self.turn = turn
        self.tools = ToolDeltas(lambda text: {"content": text}) if parses_tools else None
        self.output: list[dict] = []  # the items so far; the last one may be open
        self.is_open = False
        self.calls: dict[int, int] = {}  # a call's index in the answer -> its output index
        self.sequence_number = 0

    def event(self, kind: str, **fields) -> str:
        """An event, serialized now (items that change later are sent as they are at this point)."""
        payload = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return f"event: {kind}\ndata: {json.dumps(payload)}\n\n"

    def start(self) -> list[str]:
        response = self.turn.body("in_progress", [])
        return [
            self.event("response.created", response=response),
            self.event("response.in_progress", response=response),
        ]

    def text(self, text: str) -> list[str]:
        return self._deltas(self.tools.feed(text) if self.tools else [{"content": text}])

    def finish(self, output: dict) -> tuple[list[str], dict]:
        """The last events (the open item closed, the final Response) and that Response."""
        events = self._deltas(self.tools.finish() if self.tools else [])
        if not self.output:
            events += self._open(rb.message_item("", "in_progress"))
        status = "incomplete" if output["finish_reason"] == "length" else "completed"
        events += self._close(status)
        response = self.turn.finished(output, self.output)
        events.append(self.event(f"response.{response['status']}", response=response))
        return events, response

    def failed(self, e: APIError) -> str:
        error = {"code": "server_error", "message": str(e)}
        return self.event("response.failed", response=self.turn.body("failed", self.output, error=error))

    def _deltas(self, deltas: list[dict]) -> list[str]:
        events = []
        for delta in deltas:
            if "content" in delta:
                events += self._content(delta["content"])
            else:
                events += self._call(delta["tool_calls"][0])
        return events

    def _content(self, text: str) -> list[str]:
        events = []
        if not (self.is_open and self.output[-1]["type"] == "message"):
            events = self._close("completed") + self._open(rb.message_item("", "in_progress"))
        item = self.output[-1]
        item["content"][0]["text"] += text
        where = {"item_id": item["id"], "output_index": len(self.output) - 1, "content_index": 0}
        return events + [self.event("response.output_text.delta", delta=text, logprobs=[], **where)]

    def _call(self, delta: dict) -> list[str]:
        """A call's start (its id and name) or a piece of its arguments."""
        if "id" in delta:
            function = delta["function"]
            events = self._close("completed")
            self.calls[delta["index"]] = len(self.output)
            return events + self._open(rb.function_call_item(delta["id"], function["name"], "", "in_progress"))
        index = self.calls[delta["index"]]
        item, piece = self.output[index], delta["function"]["arguments"]
        item["arguments"] += piece
        where = {"item_id": item["id"], "output_index": index}
        return [self.event("response.function_call_arguments.delta", delta=piece, **where)]

    def _open(self, item: dict) -> list[str]:
        self.output.append(item)
        self.is_open = True
        events = [self.event("response.output_item.added", item=item, output_index=len(self.output) - 1)]
        if item["type"] == "message":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            where = {"item_id": item["id"], "output_index": len(self.output) - 1, "content_index": 0}
            events.append(self.event("response.content_part.added", part=part, **where))
        return events

    def _close(self, status: str) -> list[str]:
        """Close the open item (if any) with ``status``."""
        if not self.is_open:
            return []
        self.is_open = False
        item, index = self.output[-1], len(self.output) - 1
        if item["type"] == "function_call" and self.tools is not None:
            is_parsed = any(call.id == item["call_id"] for call in self.tools.stream.calls)
            status = "completed" if is_parsed else "incomplete"  # (a call cut short or malformed)
        item["status"] = status
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            part = item["content"][0]
            events = [self.event("response.output_text.done", text=part["text"], logprobs=[], content_index=0, **where)]
            events.append(self.event("response.content_part.done", part=part, content_index=0, **where))
        else:
            name, arguments = item["name"], item["arguments"]
            events = [self.event("response.function_call_arguments.done", name=name, arguments=arguments, **where)]
        return events + [self.event("response.output_item.done", item=item, output_index=index)]


async def sse(run: EngineRun, first: Delta | Finished, events: ResponseEvents, store: ResponseStore):
    """The response's events from its engine run; a client that hangs up cancels this generator
    (the engine aborts the request)."""
    event = first
    try:
        for line in events.start():
            yield line
        while True:
            if isinstance(event, Finished):
                lines, response = events.finish(event.output)
                events.turn.keep(store, response)
                for line in lines:
                    yield line
                return
            if event.kind == "text":
                for line in events.text(event.data):
                    yield line
            event = await run.next_event()
    except APIError as e:
        yield events.failed(e)
    finally:
        await run.close()
