"""Dynamo's ``default`` tool-call format: ``<TOOLCALL>[…]</TOOLCALL>``, ``<|python_tag|>{…}``, or a bare JSON reply.

What Dynamo parses when a worker names no tool-call parser (its ``ToolCallConfig::default``): JSON call
objects (``name`` with ``arguments`` or ``parameters``) after ``<TOOLCALL>`` (closed by ``</TOOLCALL>``)
or ``<|python_tag|>`` (no closing marker), or a reply that is itself a call object or a list of them.
A reply that is JSON but not a call (its first key is not ``name``) stays content.
"""

from __future__ import annotations

from services.postprocessor.core.parsers.tool_calls.wrapped_json import WrappedJsonToolParser


class DynamoDefaultToolParser(WrappedJsonToolParser):
    start_tags = ("<TOOLCALL>", "<|python_tag|>")
    end_tag = "</TOOLCALL>"
    bare_reply = True
