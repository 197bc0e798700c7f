"""Anthropic Messages response shapes: the message object and the SSE event stream.

The mesh's output for one request arrives as ``Delta`` records (reasoning, text and tool-call
fragments, already split by the postprocessor's parsers). One state machine turns them into
Anthropic's content-block events, and both shapes are built from those events, so a streamed reply
and a folded one cannot disagree:

    message_start
    content_block_start (thinking | text | tool_use)   one block open at a time, in output order
    content_block_delta (thinking_delta | text_delta | input_json_delta)*
    content_block_stop
    ...
    message_delta (stop_reason, stop_sequence, usage)
    message_stop                                        and nothing after it: no "[DONE]"

Within one delta, reasoning comes before text and text before tool calls, the order in which the
parsers release them. ``stop_reason`` is ``max_tokens`` when the length limit ended the turn,
``tool_use`` when the reply holds a tool call, ``stop_sequence`` (with the matched string) when a
stop sequence did, else ``end_turn``. Usage follows Anthropic's split: ``input_tokens`` are the
prompt tokens not read from the worker's prefix cache, ``cache_read_input_tokens`` those that were.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import orjson
import partial_json_parser

from services.common.errors import MeshError
from services.gateway.anthropic.errors import sse_error_event
from services.gateway.core.delta import Delta

log = logging.getLogger(__name__)
Event = dict[str, Any]


@dataclasses.dataclass
class _OpenBlock:
    index: int
    kind: str  # thinking | text | tool_use
    tool_index: int = -1  # the postprocessor's call index, for tool_use blocks


def _tool_input(arguments: str) -> dict[str, Any]:
    """The folded arguments as an object; a call cut short (max_tokens) keeps what parsed, as the SDK's stream does."""
    if not arguments:
        return {}
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        try:
            value = partial_json_parser.loads(arguments)
        except Exception:  # noqa: BLE001 - the library raises several types for hopeless input
            value = None
    if not isinstance(value, dict):
        log.warning("tool call arguments are not a JSON object: %.200s", arguments)
        return {}
    return value


class MessageRenderer:
    """One request's reply: ``sse`` / ``sse_end`` for a stream, ``fold`` / ``body`` for a message object."""

    def __init__(self, *, message_id: str, model: str):
        self.id = message_id
        self.model = model
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cached_tokens = 0
        self._finish: str | None = None
        self._stop_string = ""
        self._open: _OpenBlock | None = None
        self._blocks = 0
        self._saw_tool = False
        self._started = False
        # Folding: the blocks so far and each tool_use block's argument fragments.
        self._content: list[dict[str, Any]] = []
        self._arguments: dict[int, list[str]] = {}

    # ---- the state machine -------------------------------------------------------------------------------------

    def _account(self, d: Delta) -> None:
        self.completion_tokens += d.completion_tokens
        if d.counts_prompt:
            self.prompt_tokens += d.prompt_tokens
            self.cached_tokens += d.cached_tokens
        if d.finish_reason:
            self._finish, self._stop_string = d.finish_reason, d.stop_reason

    def _close(self, events: list[Event]) -> None:
        if self._open is not None:
            events.append({"type": "content_block_stop", "index": self._open.index})
            self._open = None

    def _start(self, events: list[Event], kind: str, block: dict[str, Any], tool_index: int = -1) -> None:
        self._close(events)
        self._open = _OpenBlock(self._blocks, kind, tool_index)
        self._blocks += 1
        events.append({"type": "content_block_start", "index": self._open.index, "content_block": block})

    def _delta(self, events: list[Event], delta: dict[str, Any]) -> None:
        assert self._open is not None
        events.append({"type": "content_block_delta", "index": self._open.index, "delta": delta})

    def _step(self, d: Delta) -> list[Event]:
        events: list[Event] = []
        self._account(d)
        if d.reasoning:
            if self._open is None or self._open.kind != "thinking":
                self._start(events, "thinking", {"type": "thinking", "thinking": "", "signature": ""})
            self._delta(events, {"type": "thinking_delta", "thinking": d.reasoning})
        if d.text:
            if self._open is None or self._open.kind != "text":
                self._start(events, "text", {"type": "text", "text": ""})
            self._delta(events, {"type": "text_delta", "text": d.text})
        for call in d.tool_calls:
            if call.name:
                self._saw_tool = True
                self._start(events, "tool_use", {"type": "tool_use", "id": call.id, "name": call.name, "input": {}},
                            call.index)
            elif self._open is None or self._open.kind != "tool_use" or self._open.tool_index != call.index:
                log.warning("argument fragment for tool call %d, which is not the open block; dropped", call.index)
                continue
            if call.arguments:
                self._delta(events, {"type": "input_json_delta", "partial_json": call.arguments})
        return events

    def stop_reason(self) -> tuple[str, str | None]:
        """(stop_reason, stop_sequence) once the turn has ended."""
        if self._finish == "length":
            return "max_tokens", None
        if self._saw_tool:
            return "tool_use", None
        if self._finish == "stop" and self._stop_string:
            return "stop_sequence", self._stop_string
        return "end_turn", None

    def usage(self) -> dict[str, int]:
        return {"input_tokens": self.prompt_tokens - self.cached_tokens, "output_tokens": self.completion_tokens,
                "cache_read_input_tokens": self.cached_tokens, "cache_creation_input_tokens": 0}

    def _message(self, content: list[dict[str, Any]], stop: tuple[str | None, str | None]) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": stop[0], "stop_sequence": stop[1], "usage": self.usage()}

    def _end(self) -> list[Event]:
        events: list[Event] = []
        self._close(events)
        reason, sequence = self.stop_reason()
        events.append({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                       "usage": self.usage()})
        events.append({"type": "message_stop"})
        return events

    # ---- streaming ---------------------------------------------------------------------------------------------

    @staticmethod
    def _frame(event: Event) -> bytes:
        return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"

    def _message_start(self) -> bytes:
        """Sent with the first batch, whose first delta carries the prompt's token counts."""
        self._started = True
        return self._frame({"type": "message_start", "message": self._message([], (None, None))})

    def sse(self, deltas: list[Delta]) -> bytes:
        """Every event the ready deltas make, in one buffer (one HttpBody)."""
        events = [e for d in deltas for e in self._step(d)]
        head = b"" if self._started else self._message_start()
        return head + b"".join(self._frame(e) for e in events)

    def sse_end(self) -> bytes:
        head = b"" if self._started else self._message_start()
        return head + b"".join(self._frame(e) for e in self._end())

    def sse_error(self, err: MeshError) -> bytes:
        """A failure after the first byte: Anthropic's in-band ``error`` event."""
        return sse_error_event(err)

    # ---- one message object ------------------------------------------------------------------------------------

    def _apply(self, event: Event) -> None:
        kind = event["type"]
        if kind == "content_block_start":
            self._content.append(dict(event["content_block"]))
            if event["content_block"]["type"] == "tool_use":
                self._arguments[event["index"]] = []
        elif kind == "content_block_delta":
            block, delta = self._content[event["index"]], event["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            else:
                self._arguments[event["index"]].append(delta["partial_json"])
        elif kind == "content_block_stop" and event["index"] in self._arguments:
            self._content[event["index"]]["input"] = _tool_input("".join(self._arguments.pop(event["index"])))

    def fold(self, deltas: list[Delta]) -> None:
        for d in deltas:
            for event in self._step(d):
                self._apply(event)

    def body(self) -> bytes:
        for event in self._end():
            self._apply(event)
        return orjson.dumps(self._message(self._content, self.stop_reason()))
