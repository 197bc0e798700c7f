"""A block of tool calls in a model's text, as kept while it is read (the formats with section markers).

Until one of its calls has started, the block's text is kept: a block that breaks before then (no
function name, an unexpected marker) is shown as the plain text it was. Once a call has started, what
a broken block still holds is dropped, and text after the block is ``AfterCallText``'s to judge.
"""

from __future__ import annotations

from services.postprocessor.core.parsers.scan import AfterCallText


class CallBlock:
    __slots__ = ("_raw", "_text", "calls")

    def __init__(self, text: AfterCallText):
        self._text = text
        self._raw: list[str] = []  # the block's text while none of its calls has started
        self.calls = 0  # calls started in this block

    def open(self, marker: str) -> None:
        """A new block begins with ``marker``."""
        self._raw, self.calls = [marker], 0

    def record(self, text: str) -> None:
        if not self.calls:
            self._raw.append(text)

    def call_started(self) -> None:
        self._raw, self.calls = [], self.calls + 1

    def show_raw(self) -> None:
        """The block broke: its text is content if no call had started, else dropped."""
        if not self.calls:
            self._text.content("".join(self._raw))
        self._raw = []

    def close(self) -> None:
        """The block's end marker: the text after it follows a call (or the block was plain text)."""
        if not self.calls:
            self.show_raw()
            return
        self._raw = []
        self._text.after_call()

    def discard(self) -> None:
        """The stream ended inside a started call: nothing of the block is shown."""
        self._raw = []
