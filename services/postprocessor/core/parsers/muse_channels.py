"""Muse Glimmer's output grammar: channel-scoped messages, each addressed to a recipient.

::

     to=self<|message|>…reasoning…<|eom|>
    <|start|>assistant to=get_weather<|message|><atem:function_calls>…</atem:function_calls><|eom|>
    <|start|>assistant to=user<|message|>…the answer…<|eot|>

The template ends the prompt with ``<|start|>assistant``, so the first header is written bare
(`` to=self<|message|>``). The recipient decides what a body is: ``self`` → reasoning, ``user`` (or no
recipient) → content, anything else (a tool, ``functions``, ``commentary``) → a tool channel, whose
ATEM calls the tool-call parser reads and whose other text is dropped. A body ends at ``<|eom|>`` /
``<|eot|>`` or where the next ``<|start|>`` header begins; the model sometimes leaves its reasoning
without ``<|eom|>`` and writes a bare `` to=NAME<|message|>`` instead, which is a switch too (in
reasoning and in unframed text, not in the answer: there it is quoted text). Output with no header
at all is plain content; text between messages is content; a stray ``<|message|>`` / ``<|eom|>`` /
``<|eot|>`` is dropped. Consecutive reasoning messages are joined by a newline.

These rules are Dynamo 1.6.1's (its unified ``muse_glimmer`` parser, replayed by
``tools/dynamo_replay.py``; differences in docs/parsers.md). vLLM (``muse_glimmer``) and SGLang
(``muse``) read the same framing. With thinking switched off Dynamo keeps the framing out but shows the
``self`` bodies as content, and so does this.

Shared by ``reasoning/muse.py`` and ``tool_calls/muse.py`` (names: muse, muse_glimmer).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from services.postprocessor.core.parsers.scan import find_marker
from services.postprocessor.core.parsers.types import TextParser, new_call_id

START = "<|start|>"
MESSAGE = "<|message|>"
EOM = "<|eom|>"
EOT = "<|eot|>"
ENDS = (EOM, EOT)
NAME_MAX = 64  # the longest recipient a header may name: a longer run is text, so nothing is held forever
HEADER_MAX = 128  # past this a <|start|> without its <|message|> is not a header
REASONING, CONTENT, TOOL = "reasoning", "content", "tool"

_BARE_HEADER = re.compile(r"to=([^\s<]{1,%d})<\|message\|>" % NAME_MAX)
_BARE_PREFIX = re.compile(r"(?:t|to|to=[^\s<]{0,%d})$" % NAME_MAX)
_RECIPIENT = re.compile(r"to=([^\s<]+)")
# A header-less switch: one whitespace character, to=NAME, then <|message|> (checked when it arrives).
_SWITCH = re.compile(r"\sto=([^\s<]{1,%d})$" % NAME_MAX)
_SWITCH_TAIL = re.compile(r"\s(?:t|to|to=[^\s<]{0,%d})?$" % NAME_MAX)
_TAIL_WINDOW = NAME_MAX + 4


def kind_of(recipient: str | None) -> str:
    if recipient == "self":
        return REASONING
    return CONTENT if recipient in (None, "user") else TOOL


class MuseChannels(TextParser):
    """Splits the channels; subclasses say what a tool channel's text becomes (``_tool_text``, ``_tool_end``).

    Args:
        prompt_opens_reasoning: the prompt already opened a ``to=self`` body.
        thinking: False when the request switched thinking off: ``self`` bodies are content then.
    """

    def __init__(self, prompt_opens_reasoning: bool = False, thinking: bool = True,
                 new_id: Callable[[], str] = new_call_id):
        super().__init__(new_id)
        self._thinking = thinking
        self._state = "start"
        self._kind = CONTENT
        self._switchable = False  # a bare " to=NAME<|message|>" may end this body
        self._header: list[str] = []
        self._last = ""  # what the last output was: reasoning, content or a call (the newline rule)
        self._body_spoke = False  # this reasoning body has emitted text
        if prompt_opens_reasoning:
            self._open("self")

    # -- what subclasses plug in ---------------------------------------------------------------

    def _tool_text(self, text: str, final: bool) -> None:
        """Text of a tool channel (dropped here: no tools were offered)."""

    def _tool_end(self) -> None:
        """A tool channel ended (its terminator, the next header, or the end of the stream)."""

    # -- output --------------------------------------------------------------------------------

    def _emit(self, text: str) -> None:
        if not text:
            return
        if self._kind == REASONING:
            if not self._body_spoke and self._last == REASONING:
                text = "\n" + text
            self._body_spoke = True
            self.out.reasoning(text)
            self._last = REASONING
        else:
            self.out.content(text)
            self._last = CONTENT

    def _call_emitted(self) -> None:
        self._last = TOOL

    # -- the scanner ---------------------------------------------------------------------------

    def _open(self, recipient: str | None) -> None:
        kind = kind_of(recipient)
        if kind == REASONING and not self._thinking:
            kind = CONTENT
        self._kind, self._body_spoke, self._state = kind, False, "body"
        self._switchable = recipient is None or recipient == "self"

    def _close_body(self) -> None:
        if self._kind == TOOL:
            self._tool_end()
        self._kind = CONTENT

    def _step(self, final: bool) -> bool:
        state = self._state
        if state == "start":
            return self._start(final)
        if state == "header":
            return self._read_header(final)
        if state == "between":
            return self._between(final)
        if self._kind == TOOL:
            return self._tool_body(final)
        return self._text_body(final)

    def _start(self, final: bool) -> bool:
        buf, pos = self._buf, self._pos
        p = pos
        while p < len(buf) and buf[p].isspace() and p - pos <= NAME_MAX:
            p += 1
        if p - pos > NAME_MAX:  # a long run of whitespace opens no header: bounded, so never rescanned long
            self._open(None)
            return True
        rest = buf[p:p + NAME_MAX + len(MESSAGE) + 3]
        header = _BARE_HEADER.match(rest)
        if header:
            self._pos = p + header.end()
            self._open(header.group(1))
            return True
        for marker in (START, MESSAGE):
            if rest.startswith(marker):
                self._pos = p + len(marker)
                if marker == START:
                    self._state, self._header = "header", []
                else:
                    self._open(None)
                return True
        if not final and self._could_be_header(rest):
            return False
        self._open(None)  # unframed text: content, its leading whitespace kept
        return True

    @staticmethod
    def _could_be_header(rest: str) -> bool:
        if not rest or START.startswith(rest) or MESSAGE.startswith(rest):
            return True
        cut = rest.find("<")
        name = rest if cut < 0 else rest[:cut]
        return bool(_BARE_PREFIX.match(name)) and (cut < 0 or MESSAGE.startswith(rest[cut:]))

    def _read_header(self, final: bool) -> bool:
        buf, pos = self._buf, self._pos
        end, marker = find_marker(buf, pos, (MESSAGE, START, *ENDS), final)
        self._header.append(buf[pos:end])
        self._pos = end
        held = sum(len(h) for h in self._header)
        if marker is None and held <= HEADER_MAX:
            return False  # more header to come, or (final) a header cut off: framing, dropped
        header = "".join(self._header)
        self._header = []
        if marker == MESSAGE and held <= HEADER_MAX:
            self._pos = end + len(MESSAGE)
            recipient = _RECIPIENT.search(header)
            self._open(recipient.group(1) if recipient else None)
            return True
        # Not a header (another marker first, or no <|message|> within HEADER_MAX): its text is content,
        # read as text between messages, so the decision is the same however the text was split.
        self._kind, self._state = CONTENT, "between"
        self._emit(header)
        return True

    def _between(self, final: bool) -> bool:
        buf, pos = self._buf, self._pos
        end, marker = find_marker(buf, pos, (START, MESSAGE, *ENDS), final)
        self._emit(buf[pos:end])
        self._pos = end + len(marker or "")
        if marker is None:
            return False
        if marker == START:
            self._state, self._header = "header", []
        return True

    def _text_body(self, final: bool) -> bool:
        buf, pos = self._buf, self._pos
        end, marker = find_marker(buf, pos, (MESSAGE, START, *ENDS), final)
        text = buf[pos:end]
        if marker is None:
            if self._switchable and not final:  # a " to=NAME" that may still become a switch is held
                tail = _SWITCH_TAIL.search(text[-_TAIL_WINDOW:])
                if tail:
                    end -= len(text[-_TAIL_WINDOW:]) - tail.start()
                    text = buf[pos:end]
            self._emit(text)
            self._pos = end
            return False
        self._pos = end + len(marker)
        if marker == MESSAGE:
            switch = _SWITCH.search(text[-_TAIL_WINDOW:]) if self._switchable else None
            if switch is None:
                self._emit(text)  # a stray <|message|>: dropped
                return True
            cut = len(text) - len(text[-_TAIL_WINDOW:]) + switch.start()
            # Dynamo keeps the space before "to=" in reasoning and drops it from unframed text.
            self._emit(text[:cut + 1] if self._kind == REASONING else text[:cut])
            self._open(switch.group(1))
            return True
        self._emit(text)
        self._close_body()
        self._state = "header" if marker == START else "between"
        self._header = []
        return True

    def _tool_body(self, final: bool) -> bool:
        buf, pos = self._buf, self._pos
        end, marker = find_marker(buf, pos, (START, *ENDS), final)
        self._tool_text(buf[pos:end], final and marker is None)
        self._pos = end + len(marker or "")
        if marker is None:
            return False
        self._close_body()
        self._state = "header" if marker == START else "between"
        self._header = []
        return True

    def _end(self) -> None:
        if self._state == "body" and self._kind == TOOL:
            self._close_body()
