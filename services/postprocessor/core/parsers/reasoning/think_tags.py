"""Reasoning between two tags, e.g. ``<think>`` … ``</think>`` (Qwen3, DeepSeek R1 and most others).

Two behaviours (dynamo-frontend.md §4.4):

- opening tag required (``qwen3``, ``basic``): output is reasoning only if it opens with the tag
  (leading whitespace allowed) or the prompt already opened it (``prompt_opens_reasoning``, e.g.
  Qwen3-2507 thinking templates);
- reasoning first (``deepseek_r1``): the template opens the block, so output is reasoning until the
  closing tag; an opening tag at the very start is skipped. No closing tag: all of it is reasoning.

Whitespace right after the opening tag, right before the closing tag and right after it is trimmed
(the template puts newlines there), so ``reasoning_content`` and ``content`` hold just the text.
"""

from __future__ import annotations

from services.postprocessor.core.parsers.scan import expect, find_marker, skip_ws
from services.postprocessor.core.parsers.types import TextParser


class _Trimmed:
    """Forwards text with leading whitespace dropped and trailing whitespace held until more text."""

    def __init__(self, emit, trail: bool):
        self._emit = emit
        self._trail = trail
        self._started = False
        self._ws = ""

    def push(self, text: str) -> None:
        if not self._started:
            text = text.lstrip()
            if not text:
                return
            self._started = True
        if self._trail:
            text = self._ws + text
            body = text.rstrip()
            self._ws = text[len(body):]
            text = body
        self._emit(text)


class ThinkTagParser(TextParser):
    """Splits reasoning from content; tool-call parsers then see only the content."""

    open_tag = "<think>"
    close_tag = "</think>"
    reasoning_first = False
    # Formats with spelling variants list them all (Granite's "Here's" / "Here is").
    open_tags: tuple[str, ...] = ()
    close_tags: tuple[str, ...] = ()
    # Markers that end reasoning without a closing tag and are themselves content (Kimi K2's tool section).
    content_starts: tuple[str, ...] = ()

    def __init__(self, prompt_opens_reasoning: bool = False):
        super().__init__()
        self._opens = self.open_tags or (self.open_tag,)
        self._closes = self.close_tags or (self.close_tag,)
        forced = prompt_opens_reasoning or self.reasoning_first
        self._state = "maybe_open" if not forced else "skip_open"
        self._reasoning = _Trimmed(self.out.reasoning, trail=True)
        self._content: _Trimmed | None = None

    def _step(self, final: bool) -> bool:
        buf, pos = self._buf, self._pos
        state = self._state
        if state == "content":
            self._emit_content(buf[pos:])
            self._pos = len(buf)
            return False
        if state == "reasoning":
            end, marker = find_marker(buf, pos, self._closes + self.content_starts, final)
            self._reasoning.push(buf[pos:end])
            self._pos = end + (len(marker) if marker in self._closes else 0)
            if marker is None:
                return False
            self._state = "content"
            self._content = _Trimmed(self.out.content, trail=False)
            return True
        p = skip_ws(buf, pos)
        verdicts = [expect(buf, p, tag, final) for tag in self._opens]
        if "yes" not in verdicts and ("wait" in verdicts or (p == len(buf) and not final)):
            return False
        if "yes" in verdicts:
            self._state, self._pos = "reasoning", p + len(self._opens[verdicts.index("yes")])
        else:
            self._state = "reasoning" if state == "skip_open" else "content"
        return True

    def _emit_content(self, text: str) -> None:
        if self._content is None:
            self.out.content(text)
        else:
            self._content.push(text)

    def _end(self) -> None:
        if self._state in ("maybe_open", "skip_open"):  # only whitespace came
            rest = self._buf[self._pos:]
            self._emit_content(rest) if self._state == "maybe_open" else self._reasoning.push(rest)


class Qwen3ReasoningParser(ThinkTagParser):
    """``<think>`` … ``</think>``; reasoning only when opened (names: qwen3, basic)."""


class DeepSeekR1ReasoningParser(ThinkTagParser):
    """``<think>`` … ``</think>`` with the block already opened by the template (deepseek_r1)."""

    reasoning_first = True


class MistralReasoningParser(ThinkTagParser):
    """Magistral: ``[THINK]`` … ``[/THINK]``, reasoning first; only when the request gives a ``reasoning_effort``
    other than ``none`` (preprocessor/core/thinking.py), else there is no reasoning parser, as in Dynamo."""

    open_tag = "[THINK]"
    close_tag = "[/THINK]"
    reasoning_first = True


class KimiReasoningParser(ThinkTagParser):
    """Kimi: ``◁think▷`` … ``◁/think▷``, reasoning only when opened."""

    open_tag = "◁think▷"
    close_tag = "◁/think▷"


class KimiK2ReasoningParser(ThinkTagParser):
    """Kimi K2 Thinking / K2.5: ``<think>`` … ``</think>``, reasoning only when opened.

    The model opens the block itself (the template ends with the assistant header), so a plain answer
    with no markers is content, as in Dynamo. It may leave reasoning by starting its tool-call section
    without closing the block: ``<|tool_calls_section_begin|>`` ends the reasoning and is passed on, with
    what follows, to the tool-call parser (kimi_k2). ``thinking: false`` in chat_template_kwargs keeps the
    parser, so a block the model writes anyway is still separated (Dynamo does the same).
    """

    content_starts = ("<|tool_calls_section_begin|>", "<|tool_call_section_begin|>")


class MiniMaxReasoningParser(ThinkTagParser):
    """MiniMax M2 / M2.1: ``<think>`` … ``</think>``, reasoning first.

    The M2 template ends the prompt with ``<think>\n``, so the output starts inside the block (a
    repeated opening tag is skipped) and everything before ``</think>`` is reasoning (minimax).
    """

    reasoning_first = True


class NemotronReasoningParser(ThinkTagParser):
    """NVIDIA Nemotron Nano v2 / v3: ``<think>`` … ``</think>``, reasoning first.

    The template opens the block when thinking is on; with ``enable_thinking: false`` the request
    has no reasoning parser at all, so the whole output is content (nemotron).
    """

    reasoning_first = True
