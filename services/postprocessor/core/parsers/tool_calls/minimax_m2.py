"""MiniMax M2 / M2.1 tool calls: ``invoke`` elements inside one section::

    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Paris</parameter>
    <parameter name="days">3</parameter>
    </invoke>
    </minimax:tool_call>

Names may be double-, single- or un-quoted. Values are raw text typed by the request's tool schema
(``param_types.py``), with surrounding whitespace trimmed.
"""

from __future__ import annotations

import re

from services.postprocessor.core.parsers.tool_calls.xml_calls import XmlCallParser

_NAME = re.compile(r"""name\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'>]+))""")


def attribute_name(header: str) -> str:
    """The ``name="…"`` attribute of a tag's header ("" when absent)."""
    match = _NAME.search(header)
    return next((g for g in match.groups() if g is not None), "").strip() if match else ""


class MiniMaxM2ToolParser(XmlCallParser):
    """``<minimax:tool_call><invoke name="N"><parameter name="K">V</parameter>…</invoke>…`` (minimax_m2)."""

    section_begin = "<minimax:tool_call>"
    section_end = "</minimax:tool_call>"
    call_begin = "<invoke"
    call_header_ends = (">",)
    call_end = "</invoke>"
    param_begin = "<parameter"
    param_header_end = ">"
    param_end = "</parameter>"
    trim = "strip"

    def call_name(self, header: str) -> str:
        return attribute_name(header)

    def param_header(self, header: str) -> tuple[str, bool | None]:
        return attribute_name(header), None
