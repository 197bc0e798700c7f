"""Inkling's output grammar: typed content blocks, each opened by special tokens and closed by ``<|end_message|>``.

::

    <|message_model|><|content_thinking|>…reasoning…<|end_message|>
    <|message_model|><|content_text|>…visible text…<|end_message|>
    <|message_model|>get_weather<|content_invoke_tool_json|>{"name": "get_weather", "args": {…}}<|end_message|>

Blocks repeat in any order. ``<|message_model|>`` starts a message header: what follows it up to
the block's kind marker (an optional function name) is metadata, not text. Sampling may also end
a block with ``<|content_model_end_sampling|>``. Raw-text tool blocks (``<|content_invoke_tool_text|>``)
and tool errors (``<|content_tool_error|>``) render as visible text. The template ends the prompt
with ``<|message_model|>``, so a reply starts in a header; text there before any marker is the
plain answer of a model that wrote no block (kept as content).

Shared by ``reasoning/inkling.py`` and ``tool_calls/inkling.py`` (names: inkling).
"""

from __future__ import annotations

MESSAGE_MODEL = "<|message_model|>"
CONTENT_TEXT = "<|content_text|>"
CONTENT_THINKING = "<|content_thinking|>"
CONTENT_TOOL_JSON = "<|content_invoke_tool_json|>"
CONTENT_TOOL_TEXT = "<|content_invoke_tool_text|>"
CONTENT_TOOL_ERROR = "<|content_tool_error|>"
END_SAMPLING = "<|content_model_end_sampling|>"
END_MESSAGE = "<|end_message|>"

BLOCK_ENDS = (END_MESSAGE, END_SAMPLING)
VISIBLE_KINDS = (CONTENT_TEXT, CONTENT_TOOL_TEXT, CONTENT_TOOL_ERROR)
MARKERS = (MESSAGE_MODEL, CONTENT_THINKING, CONTENT_TOOL_JSON, *VISIBLE_KINDS, *BLOCK_ENDS)
