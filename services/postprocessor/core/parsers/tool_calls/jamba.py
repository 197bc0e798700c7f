"""AI21 Jamba tool calls: ``<tool_calls>[{"name": …, "arguments": {…}}, …]</tool_calls>``.

Jamba 1.5/1.6/1.7 templates (and vLLM's ``jamba`` parser) wrap a JSON list of calls in
``<tool_calls>`` … ``</tool_calls>``; Dynamo's ``jamba`` reads the same markers.
"""

from __future__ import annotations

from services.postprocessor.core.parsers.tool_calls.wrapped_json import WrappedJsonToolParser


class JambaToolParser(WrappedJsonToolParser):
    start_tags = ("<tool_calls>",)
    end_tag = "</tool_calls>"
