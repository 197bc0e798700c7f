"""Dynamo's streaming dispatch events on /v1/chat/completions (``--enable-streaming-tool-dispatch``,
``--enable-streaming-reasoning-dispatch``): named SSE events beside the chunks, so that an agent can
start a tool or show the reasoning without reassembling deltas.

- ``event: tool_call_dispatch``, ``data: {"choice_index": i, "tool_call": {"index", "id", "type",
  "function": {"name", "arguments"}}}``: one per tool call, once the call is complete. The postprocessor
  streams a call's arguments in fragments and marks no call's end, so a call is complete when the same
  choice starts its next call or finishes; the event goes out just before the chunk that shows it (for the
  last call, the chunk with ``finish_reason``).
- ``event: reasoning_dispatch``, ``data: {"index": i, "reasoning_content": "..."}``: one per choice with
  the whole reasoning, once it ends: the choice's first content or tool call after it, or its finish.
  The key is ``reasoning_content`` whatever ``--reasoning-field-name`` says, as in Dynamo.

Both payloads are Dynamo's (lib/llm/src/http/service/openai.rs). Only a streamed chat request gets
them, and only when a flag is on: ``DispatchingChatRenderer`` is a separate class, so the plain
renderer's per-token path carries no check for them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson

from services.gateway.core.delta import Delta
from services.gateway.openai.render import ChatRenderer

TOOL_CALL_EVENT = b"tool_call_dispatch"
REASONING_EVENT = b"reasoning_dispatch"


def event(name: bytes, payload: dict[str, Any]) -> bytes:
    return b"event: " + name + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


@dataclasses.dataclass
class _ChoiceState:
    reasoning: list[str] = dataclasses.field(default_factory=list)
    # The call being streamed: its index, id and name, and its argument fragments so far.
    call: dict[str, Any] | None = None
    arguments: list[str] = dataclasses.field(default_factory=list)


class Dispatcher:
    """Per choice state; ``before(delta)`` is the events that go out just before the delta's chunk."""

    def __init__(self, n_choices: int, *, tool_calls: bool, reasoning: bool):
        self._tools = tool_calls
        self._reasoning = reasoning
        self._choices = [_ChoiceState() for _ in range(n_choices)]

    def before(self, d: Delta) -> bytes:
        c = self._choices[d.index]
        out = b""
        if self._reasoning:
            if d.reasoning:
                c.reasoning.append(d.reasoning)
            # Reasoning ends where content or a call begins (the same delta may carry both when tokens
            # are gathered: nvext.stream_interval), or at the finish; an empty delta settles nothing.
            if c.reasoning and (d.text or d.tool_calls or d.finish_reason is not None):
                out += event(REASONING_EVENT, {"index": d.index, "reasoning_content": "".join(c.reasoning)})
                c.reasoning.clear()
        if self._tools:
            for call in d.tool_calls:
                if call.name:  # a call's first delta: the one before it is complete
                    out += self._complete(d.index, c)
                    c.call = {"index": call.index, "id": call.id, "name": call.name}
                c.arguments.append(call.arguments)
            if d.finish_reason is not None:
                out += self._complete(d.index, c)
        return out

    @staticmethod
    def _complete(index: int, c: _ChoiceState) -> bytes:
        """The event of the choice's call in progress (none: nothing), which it then forgets."""
        call, arguments = c.call, "".join(c.arguments)
        c.call = None
        c.arguments.clear()
        if call is None:
            return b""
        return event(TOOL_CALL_EVENT, {"choice_index": index, "tool_call": {
            "index": call["index"], "id": call["id"], "type": "function",
            "function": {"name": call["name"], "arguments": arguments}}})


@dataclasses.dataclass(frozen=True)
class ChatOutput:
    """The gateway's switches over its chat answers: the reasoning field's name and the dispatch events."""

    reasoning_field: str = "reasoning_content"
    tool_dispatch: bool = False
    reasoning_dispatch: bool = False

    def renderer(self, streamed: bool, **kwargs: Any) -> ChatRenderer:
        """A chat request's renderer (``kwargs``: ``ChatRenderer``'s); events only for a streamed one."""
        if streamed and (self.tool_dispatch or self.reasoning_dispatch):
            return DispatchingChatRenderer(tool_calls=self.tool_dispatch, reasoning=self.reasoning_dispatch,
                                           reasoning_field=self.reasoning_field, **kwargs)
        return ChatRenderer(reasoning_field=self.reasoning_field, **kwargs)


# reasoning_content, no dispatch events: the gateway's defaults.
PLAIN_CHAT = ChatOutput()


class DispatchingChatRenderer(ChatRenderer):
    """The chat renderer with the dispatch events before the chunks they belong to (streamed only)."""

    def __init__(self, *, tool_calls: bool, reasoning: bool, **kwargs: Any):
        super().__init__(**kwargs)
        self._dispatch = Dispatcher(len(self.choices), tool_calls=tool_calls, reasoning=reasoning)

    def sse(self, deltas: list[Delta]) -> bytes:
        out = []
        for d in deltas:
            events = self._dispatch.before(d)
            if events:
                out.append(events)
            out.append(super().sse([d]))
        return b"".join(out)
