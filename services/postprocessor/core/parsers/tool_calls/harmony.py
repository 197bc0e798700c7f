"""OpenAI Harmony (gpt-oss): channels carry reasoning, tool calls and the answer.

The reply is a run of messages, each ``[<|start|>assistant]<|channel|>CHANNEL[ to=RECIPIENT]
[<|constrain|>json]<|message|>BODY`` ended by ``<|end|>``, ``<|call|>`` or ``<|return|>`` (the last
two are stop tokens, so usually the stream just ends). The recipient may also stand before
``<|channel|>``. Routing of a body:

- ``analysis`` → reasoning; a recipient that is not ``functions.*`` (built-in browser / python) too;
- ``commentary to=functions.NAME`` → tool call NAME, the body streamed as its arguments
  (when tools were offered; otherwise it is content);
- ``final``, and ``commentary`` without a recipient (a preamble meant for the user) → content.

A reply that does not open with ``<|channel|>`` or ``<|start|>`` is plain content. This one class is
both the ``harmony`` tool-call parser and the ``gpt_oss`` reasoning parser.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from services.postprocessor.core.parsers.scan import expect, find_marker, skip_ws
from services.postprocessor.core.parsers.types import TextParser, new_call_id

START = "<|start|>"
CHANNEL = "<|channel|>"
MESSAGE = "<|message|>"
_BODY_ENDS = ("<|end|>", "<|call|>", "<|return|>")
_CHANNEL_NAME = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")
_RECIPIENT = re.compile(r"to=([^\s<]+)")


class HarmonyParser(TextParser):
    """Args: tools_enabled: ``functions.*`` messages become tool calls (the request offered tools)."""

    def __init__(self, tools_enabled: bool = True, new_id: Callable[[], str] = new_call_id):
        super().__init__(new_id)
        self._tools = tools_enabled
        self._state = "start"
        self._header: list[str] = []
        self._route = self.out.content

    def _step(self, final: bool) -> bool:  # noqa: PLR0911 - one return per state of the scanner
        buf, pos = self._buf, self._pos
        state = self._state
        if state == "plain":
            self.out.content(buf[pos:])
            self._pos = len(buf)
            return False
        if state in ("start", "between"):
            return self._message_start(buf, pos, final)
        if state == "header":
            end, marker = find_marker(buf, pos, (MESSAGE,), final)
            self._header.append(buf[pos:end])
            self._pos = end + len(marker or "")
            if marker is None:
                return False
            self._open_body("".join(self._header))
            return True
        if state == "skip":  # stray text between messages
            end, marker = find_marker(buf, pos, (START, CHANNEL), final)
            self._pos = end
            if marker is None:
                return False
            self._state = "between"
            return True
        end, marker = find_marker(buf, pos, (*_BODY_ENDS, START, CHANNEL), final)
        self._route(buf[pos:end])
        self._pos = end
        if marker is None:
            return False
        if marker in _BODY_ENDS:
            self._pos = end + len(marker)
        self._state = "between"
        return True

    def _message_start(self, buf: str, pos: int, final: bool) -> bool:
        p = skip_ws(buf, pos)
        for marker, consume in ((START, True), (CHANNEL, False)):
            verdict = expect(buf, p, marker, final)
            if verdict == "wait":
                return False
            if verdict == "yes":
                self._header = []
                self._state, self._pos = "header", p + (len(marker) if consume else 0)
                return True
        if p == len(buf) and not final:
            return False
        self._state = "plain" if self._state == "start" else "skip"
        return True

    def _open_body(self, header: str) -> None:
        channel = _CHANNEL_NAME.search(header)
        recipient = _RECIPIENT.search(header)
        name = channel.group(1) if channel else ""
        to = recipient.group(1) if recipient else ""
        if to.startswith("functions.") and self._tools:
            self.out.start_call(to[len("functions."):])
            self._route = self.out.arguments
        elif name == "analysis" or (to and not to.startswith("functions.")):
            self._route = self.out.reasoning
        else:
            self._route = self.out.content
        self._state = "body"
