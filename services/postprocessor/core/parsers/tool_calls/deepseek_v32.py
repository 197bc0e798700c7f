"""DeepSeek V3.2 tool calls, in its DSML markup (the bars are U+FF5C)::

    <｜DSML｜function_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls>

Each parameter says itself whether its value is a string (``string="true"``, kept exactly) or JSON
(``string="false"``, forwarded as written; text that is not JSON stays a string). Without the
attribute the request's tool schema decides. V3 / R1 / V3.1 are ``deepseek.py``.
"""

from __future__ import annotations

import re

from services.postprocessor.core.parsers.tool_calls.minimax_m2 import attribute_name
from services.postprocessor.core.parsers.tool_calls.xml_calls import XmlCallParser

_STRING_ATTRIBUTE = re.compile(r"""string\s*=\s*["']?(true|false)""", re.IGNORECASE)


class DeepSeekV32ToolParser(XmlCallParser):
    """``<｜DSML｜function_calls><｜DSML｜invoke name="N"><｜DSML｜parameter name="K" string="…">V…`` (deepseek_v32)."""

    section_begin = "<｜DSML｜function_calls>"
    section_end = "</｜DSML｜function_calls>"
    call_begin = "<｜DSML｜invoke"
    call_header_ends = (">",)
    call_end = "</｜DSML｜invoke>"
    param_begin = "<｜DSML｜parameter"
    param_header_end = ">"
    param_end = "</｜DSML｜parameter>"
    trim = "none"

    def call_name(self, header: str) -> str:
        return attribute_name(header)

    def param_header(self, header: str) -> tuple[str, bool | None]:
        flag = _STRING_ATTRIBUTE.search(header)
        return attribute_name(header), (flag.group(1).lower() == "true") if flag else None
