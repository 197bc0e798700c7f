"""Microsoft Phi-4-mini tool calls: ``functools[{"name": …, "arguments": {…}}, …]``.

Phi-4-mini-instruct answers a call with the word ``functools`` followed by a JSON list of calls and
no closing marker (vLLM's ``phi4_mini_json``, Dynamo's ``phi4``).
"""

from __future__ import annotations

from services.postprocessor.core.parsers.tool_calls.wrapped_json import WrappedJsonToolParser


class Phi4ToolParser(WrappedJsonToolParser):
    start_tags = ("functools",)
