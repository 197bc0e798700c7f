"""Qwen3-Coder (and Qwen3.5 / Qwen3-Next coder templates) tool calls: one XML block per call::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

Values are raw text typed by the request's tool schema (``param_types.py``); the newline after
``<parameter=NAME>`` and the one before ``</parameter>`` are the template's layout, not the value.
"""

from __future__ import annotations

from services.postprocessor.core.parsers.tool_calls.xml_calls import XmlCallParser


class Qwen3CoderToolParser(XmlCallParser):
    """``<tool_call><function=NAME><parameter=P>V</parameter>…</function></tool_call>`` (qwen3_coder)."""

    section_begin = "<tool_call>"
    section_end = "</tool_call>"
    call_begin = "<function="
    call_header_ends = (">",)
    call_end = "</function>"
    param_begin = "<parameter="
    param_header_end = ">"
    param_end = "</parameter>"
    trim = "newline"
