"""What every streaming parser produces, and the machinery they share.

A parser is fed text deltas and returns ``ParsedDelta`` records: content, reasoning and tool-call
deltas in OpenAI's streaming shape (a call's index, id and name once, then argument fragments).
The contract that makes streaming safe for agents: the concatenation of everything a parser returns
for a text depends only on the text, never on how it was split into chunks, so a streaming client
and a non-streaming one get the same answer. Parsers achieve it by deciding only from text they have
seen (holding back a possible partial marker until the next chunk settles it) and by working from a
position in a buffer, so the work per chunk is proportional to the new text.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable


def new_call_id() -> str:
    """An OpenAI-style tool call id."""
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclasses.dataclass
class ToolCallDelta:
    """One tool call's new output; ``id`` and ``name`` are set only on the call's first delta."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclasses.dataclass
class ParsedDelta:
    """The parsed form of one text delta."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallDelta] = dataclasses.field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.tool_calls)


def concat(first: ParsedDelta | None, second: ParsedDelta) -> ParsedDelta:
    """Both deltas as one (``first`` may be None)."""
    if first is None:
        return second
    return ParsedDelta(first.content + second.content, first.reasoning + second.reasoning,
                       first.tool_calls + second.tool_calls)


class Emitter:
    """Collects a parser's output until the caller takes it (once per fed chunk)."""

    def __init__(self, new_id: Callable[[], str] = new_call_id):
        self._new_id = new_id
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: list[ToolCallDelta] = []
        self._args: list[str] = []  # fragments of the last call in _calls, joined on take()
        self.calls = 0  # tool calls started so far
        # Ids made from the call's name and index (Kimi's ``functions.NAME:N``); None: ``new_id()``.
        self.call_id: Callable[[str, int], str] | None = None

    def content(self, text: str) -> None:
        if text:
            self._content.append(text)

    def reasoning(self, text: str) -> None:
        if text:
            self._reasoning.append(text)

    def start_call(self, name: str) -> None:
        self._close_args()
        call_id = self.call_id(name, self.calls) if self.call_id is not None else self._new_id()
        self._calls.append(ToolCallDelta(self.calls, call_id, name))
        self.calls += 1

    def arguments(self, text: str) -> None:
        if not text:
            return
        if not self._calls or self._calls[-1].index != self.calls - 1:
            self._close_args()
            self._calls.append(ToolCallDelta(self.calls - 1))
        self._args.append(text)

    def _close_args(self) -> None:
        if self._args:
            self._calls[-1].arguments += "".join(self._args)
            self._args = []

    def take(self) -> ParsedDelta:
        self._close_args()
        out = ParsedDelta("".join(self._content), "".join(self._reasoning), self._calls)
        self._content, self._reasoning, self._calls = [], [], []
        return out


class TextParser:
    """Base of every parser: a buffer read from a position, drained by ``_step`` until it stalls.

    Subclasses implement ``_step(final)``: consume some of ``self._buf`` from ``self._pos`` (emitting
    into ``self.out``) and return True, or return False when nothing more can be decided before more
    text arrives (``final`` is True once no more text will come: then every step must decide).
    """

    def __init__(self, new_id: Callable[[], str] = new_call_id):
        self.out = Emitter(new_id)
        self._buf = ""
        self._pos = 0

    def feed(self, text: str) -> ParsedDelta:
        """Adds streamed text; returns what it settled."""
        self._buf = self._buf[self._pos:] + text if self._pos < len(self._buf) else text
        self._pos = 0
        while self._step(False):
            pass
        return self.out.take()

    def finish(self) -> ParsedDelta:
        """End of the stream: settles everything still held back."""
        self._buf = self._buf[self._pos:]
        self._pos = 0
        while self._step(True):
            pass
        self._end()
        return self.out.take()

    @property
    def tool_calls(self) -> int:
        """How many tool calls were started."""
        return self.out.calls

    def _step(self, final: bool) -> bool:
        raise NotImplementedError

    def _end(self) -> None:
        """Hook for what must happen once the stream is over and every step is done."""
