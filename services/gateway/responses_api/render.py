"""The response object and the Responses event grammar, from the pipeline's deltas. Pure.

One state machine serves both modes: ``feed`` turns deltas into output items and returns the events
that announce them; a streamed response sends the events as SSE, a non-streamed one discards them and
sends ``response()`` at the end. Output items open and close in generation order:

    reasoning  output_item.added, content_part.added (reasoning_text), reasoning_text.delta...,
               reasoning_text.done, content_part.done, output_item.done
    message    output_item.added, content_part.added (output_text), output_text.delta...,
               output_text.done, content_part.done, output_item.done
    function   output_item.added, function_call_arguments.delta..., function_call_arguments.done,
    call       output_item.done

framed by response.created and response.in_progress before the first item, and one of
response.completed, response.incomplete (max_output_tokens reached) or response.failed at the end.
Every event carries ``sequence_number``, 0 first; there is no ``[DONE]`` (OpenAI sends none and the
SDK needs none).

``output_tokens_details.reasoning_tokens`` is counted from the deltas: a delta's tokens are reasoning
tokens in the share of its new characters that are reasoning (the postprocessor reports tokens per
delta, not per kind; a delta mixes kinds only at the boundary where reasoning ends).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from services.common.errors import MeshError
from services.gateway.core.delta import Delta
from services.gateway.responses_api.request import ResponsesRequest


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclasses.dataclass
class _Open:
    """The output item being generated."""

    index: int
    item: dict[str, Any]
    text: list[str] = dataclasses.field(default_factory=list)


def echo_fields(req: ResponsesRequest) -> dict[str, Any]:
    """The request parameters a response object repeats."""
    return {
        "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
        "metadata": req.metadata, "model": req.model, "parallel_tool_calls": req.parallel_tool_calls,
        "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": req.reasoning_effort, "summary": None}, "store": req.store,
        "temperature": req.temperature, "text": {"format": req.text_format}, "tool_choice": req.tool_choice,
        "tools": req.tools, "top_p": req.top_p, "truncation": req.bookkeeping.get("truncation", "disabled"),
        "user": req.bookkeeping.get("user"), "background": False,
        **{k: v for k, v in req.bookkeeping.items() if k not in ("user", "truncation")},
    }


class ResponseObjectBuilder:
    """One response: its output items as they are generated, the events announcing them, its usage."""

    def __init__(self, response_id: str, echo: dict[str, Any], created_at: int | None = None):
        self.id = response_id
        self.echo = echo
        self.created_at = created_at if created_at is not None else int(time.time())
        self.output: list[dict[str, Any]] = []
        self.status = "in_progress"
        self.error: dict[str, Any] | None = None
        self.incomplete = False
        self.completed_at: int | None = None
        self.input_tokens = 0
        self.cached_tokens = 0
        self.output_tokens = 0
        self.reasoning_tokens = 0.0
        self._open: _Open | None = None
        self._seq = 0

    # --- events

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event

    def start(self) -> list[dict[str, Any]]:
        """response.created and response.in_progress: the response before any output."""
        return [self._event("response.created", response=self.response()),
                self._event("response.in_progress", response=self.response())]

    def _open_item(self, item: dict[str, Any], part: dict[str, Any] | None) -> list[dict[str, Any]]:
        self._open = _Open(len(self.output), item)
        self.output.append(item)
        events = [self._event("response.output_item.added", output_index=self._open.index, item=_copy(item))]
        if part is not None:
            events.append(self._event("response.content_part.added", item_id=item["id"],
                                      output_index=self._open.index, content_index=0, part=part))
        return events

    def _close(self, status: str) -> list[dict[str, Any]]:
        o = self._open
        if o is None:
            return []
        self._open = None
        item, where = o.item, {"item_id": o.item["id"], "output_index": o.index}
        text = "".join(o.text)
        item["status"] = status
        events = []
        if item["type"] == "message":
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            item["content"] = [part]
            events += [self._event("response.output_text.done", **where, content_index=0, text=text, logprobs=[]),
                       self._event("response.content_part.done", **where, content_index=0, part=part)]
        elif item["type"] == "reasoning":
            part = {"type": "reasoning_text", "text": text}
            item["content"] = [part]
            events += [self._event("response.reasoning_text.done", **where, content_index=0, text=text),
                       self._event("response.content_part.done", **where, content_index=0, part=part)]
        else:
            item["arguments"] = text
            events.append(self._event("response.function_call_arguments.done", **where, arguments=text))
        events.append(self._event("response.output_item.done", output_index=o.index, item=_copy(item)))
        return events

    def _switch(self, kind: str) -> list[dict[str, Any]]:
        """Closes the open item unless it is of ``kind``; opens a new one of ``kind`` (not function calls)."""
        if self._open is not None and self._open.item["type"] == kind:
            return []
        events = self._close("completed")
        if kind == "message":
            item = {"id": new_id("msg"), "type": "message", "status": "in_progress", "role": "assistant",
                    "content": []}
            events += self._open_item(item, {"type": "output_text", "text": "", "annotations": [], "logprobs": []})
        else:
            item = {"id": new_id("rs"), "type": "reasoning", "status": "in_progress", "summary": [], "content": []}
            events += self._open_item(item, {"type": "reasoning_text", "text": ""})
        return events

    def _append(self, kind: str, text: str) -> dict[str, Any]:
        assert self._open is not None
        self._open.text.append(text)
        where = {"item_id": self._open.item["id"], "output_index": self._open.index}
        if kind == "reasoning":
            return self._event("response.reasoning_text.delta", **where, content_index=0, delta=text)
        if kind == "message":
            return self._event("response.output_text.delta", **where, content_index=0, delta=text, logprobs=[])
        return self._event("response.function_call_arguments.delta", **where, delta=text)

    def feed(self, deltas: list[Delta]) -> list[dict[str, Any]]:
        """The events for these deltas (one choice: the Responses API has no ``n``)."""
        events: list[dict[str, Any]] = []
        for d in deltas:
            self._account(d)
            if d.reasoning:
                events += self._switch("reasoning")
                events.append(self._append("reasoning", d.reasoning))
            if d.text:
                events += self._switch("message")
                events.append(self._append("message", d.text))
            for call in d.tool_calls:
                if call.name:  # a new call
                    events += self._close("completed")
                    item = {"id": new_id("fc"), "type": "function_call", "status": "in_progress",
                            "call_id": call.id, "name": call.name, "arguments": ""}
                    events += self._open_item(item, None)
                if call.arguments and self._open is not None and self._open.item["type"] == "function_call":
                    events.append(self._append("function_call", call.arguments))
            if d.finish_reason == "length":
                self.incomplete = True
        return events

    def _account(self, d: Delta) -> None:
        self.output_tokens += d.completion_tokens
        if d.counts_prompt:
            self.input_tokens += d.prompt_tokens
            self.cached_tokens += d.cached_tokens
        if d.reasoning and d.completion_tokens:
            other = len(d.text) + sum(len(c.arguments) + len(c.name) for c in d.tool_calls)
            self.reasoning_tokens += d.completion_tokens * len(d.reasoning) / (len(d.reasoning) + other)

    def finish(self) -> list[dict[str, Any]]:
        """Closes the last item and settles the status: completed, or incomplete when max_output_tokens
        ended it. The response is final from here on (what gets stored); ``final_event`` announces it."""
        self.status = "incomplete" if self.incomplete else "completed"
        self.completed_at = int(time.time())
        return self._close(self.status)

    def final_event(self) -> dict[str, Any]:
        """response.completed, or response.incomplete; after ``finish``."""
        kind = "response.incomplete" if self.status == "incomplete" else "response.completed"
        return self._event(kind, response=self.response())

    def fail(self, err: MeshError) -> list[dict[str, Any]]:
        """response.failed: the stream broke after it began; the item being generated stays incomplete."""
        if self._open is not None:
            self._open.item["status"] = "incomplete"
            self._finish_open_fields()
        self.status = "failed"
        self.completed_at = None
        self.error = {"code": "server_error", "message": err.message}
        return [self._event("response.failed", response=self.response())]

    def _finish_open_fields(self) -> None:
        o = self._open
        assert o is not None
        text = "".join(o.text)
        if o.item["type"] == "message":
            o.item["content"] = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        elif o.item["type"] == "reasoning":
            o.item["content"] = [{"type": "reasoning_text", "text": text}]
        else:
            o.item["arguments"] = text
        self._open = None

    # --- the response object

    def usage(self) -> dict[str, Any]:
        return {"input_tokens": self.input_tokens, "input_tokens_details": {"cached_tokens": self.cached_tokens},
                "output_tokens": self.output_tokens,
                "output_tokens_details": {"reasoning_tokens": round(self.reasoning_tokens)},
                "total_tokens": self.input_tokens + self.output_tokens}

    def response(self) -> dict[str, Any]:
        done = self.status in ("completed", "incomplete")
        return {"id": self.id, "object": "response", "created_at": self.created_at, "status": self.status,
                "completed_at": self.completed_at, "error": self.error,
                "incomplete_details": {"reason": "max_output_tokens"} if self.status == "incomplete" else None,
                "output": [_copy(item) for item in self.output], "usage": self.usage() if done else None,
                **self.echo}


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    """A snapshot: events must not change when the item grows later."""
    return {k: (list(v) if isinstance(v, list) else v) for k, v in item.items()}


def sse(events: list[dict[str, Any]]) -> bytes:
    """Events as SSE frames, each named by an ``event:`` line as OpenAI sends them."""
    return b"".join(b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events)


class ResponsesRenderer:
    """The front door's renderer over a ``ResponseObjectBuilder``, with the store as its completion hook.

    ``complete`` (the front door's ``on_complete``) settles the response and stores it before the client
    learns it is done: before the body, or before ``response.completed``. A stream's first frame
    opens with response.created and response.in_progress; a failure after it is ``response.failed``.
    """

    def __init__(self, builder: ResponseObjectBuilder,
                 store: Callable[[ResponseObjectBuilder], Awaitable[None]]):
        self.builder = builder
        self._store = store
        self._opened = False
        self._closing: list[dict[str, Any]] = []  # the last item's closing events, from ``complete``

    prompt_tokens = property(lambda self: self.builder.input_tokens)
    completion_tokens = property(lambda self: self.builder.output_tokens)
    cached_tokens = property(lambda self: self.builder.cached_tokens)

    def _open(self) -> list[dict[str, Any]]:
        if self._opened:
            return []
        self._opened = True
        return self.builder.start()

    async def complete(self) -> None:
        self._closing = self.builder.finish()
        await self._store(self.builder)

    def fold(self, deltas: list[Delta]) -> None:
        self.builder.feed(deltas)  # the events are the stream's; a folded response needs only the items

    def body(self) -> bytes:
        return orjson.dumps(self.builder.response())

    def sse(self, deltas: list[Delta]) -> bytes:
        return sse(self._open() + self.builder.feed(deltas))

    def sse_end(self) -> bytes:
        return sse([*self._open(), *self._closing, self.builder.final_event()])

    def sse_error(self, err: MeshError) -> bytes:
        return sse(self._open() + self._closing + self.builder.fail(err))

    def usage(self) -> dict[str, Any]:
        return self.builder.usage()
