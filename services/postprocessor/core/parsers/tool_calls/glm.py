"""GLM-4.5 / GLM-4.6 / GLM-4.7 tool calls: the name, then key / value tag pairs::

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

GLM-4.7 drops the newline after the name (``<tool_call>get_weather<arg_key>city</arg_key>…``); one
parser reads both, since the name ends at a newline, at ``<arg_key>`` or at ``</tool_call>`` (a call
without arguments). Values are raw text typed by the request's tool schema (``param_types.py``);
the template writes them without surrounding whitespace, so a string value is kept exactly.
"""

from __future__ import annotations

from services.postprocessor.core.parsers.tool_calls.xml_calls import XmlCallParser


class GlmToolParser(XmlCallParser):
    """``<tool_call>NAME[\\n]<arg_key>K</arg_key><arg_value>V</arg_value>…</tool_call>`` (glm45, glm47)."""

    call_begin = "<tool_call>"
    call_header_ends = ("\n", "<arg_key>", "</tool_call>")
    call_end = "</tool_call>"
    param_begin = "<arg_key>"
    param_header_end = "</arg_key>"
    value_open = "<arg_value>"
    param_end = "</arg_value>"
    trim = "none"
