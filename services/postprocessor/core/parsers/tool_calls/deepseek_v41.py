"""DeepSeek V4.1 tool calls: V4's DSML (``deepseek_v4.py``) with a space after the DSML marker::

    <｜DSML｜ calls>
    <｜DSML｜ invoke name="get_weather">
    <｜DSML｜ parameter name="city" string="true">Paris</｜DSML｜ parameter>
    </｜DSML｜ invoke>
    </｜DSML｜ calls>

The block is ``calls`` and every tag name starts with a space (SGLang's ``DeepSeekV41Detector`` and
vLLM's ``deepseek_v41`` parser spell them so); the rest, self-closing calls included, is V4's.
"""

from __future__ import annotations

from services.postprocessor.core.parsers.tool_calls.deepseek_v4 import DeepSeekV4ToolParser


class DeepSeekV41ToolParser(DeepSeekV4ToolParser):
    """``<｜DSML｜ calls><｜DSML｜ invoke name="N"><｜DSML｜ parameter name="K" string="…">V…`` (deepseek_v41)."""

    section_begin = "<｜DSML｜ calls>"
    section_end = "</｜DSML｜ calls>"
    call_begin = "<｜DSML｜ invoke"
    call_end = "</｜DSML｜ invoke>"
    param_begin = "<｜DSML｜ parameter"
    param_end = "</｜DSML｜ parameter>"
