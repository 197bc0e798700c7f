"""DeepSeek V4 tool calls: V3.2's DSML markup (``deepseek_v32.py``) in a ``tool_calls`` block::

    <｜DSML｜tool_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
    </｜DSML｜invoke>
    <｜DSML｜invoke name="get_time"/>
    </｜DSML｜tool_calls>

V4 renames V3.2's ``function_calls`` block and writes a call without arguments as a self-closing
``invoke`` (SGLang's and vLLM's V4 parsers read both; their chat template renders calls so). A
parameter's ``string`` attribute decides its type exactly as in V3.2. Not read: the ``toolcalls`` /
``tool`` misspellings of the block vLLM also accepts, and a JSON object written directly inside an
``invoke`` instead of parameters (both are outside the published template; docs/parsers.md).
"""

from __future__ import annotations

from services.postprocessor.core.parsers.tool_calls.deepseek_v32 import DeepSeekV32ToolParser


class DeepSeekV4ToolParser(DeepSeekV32ToolParser):
    """``<｜DSML｜tool_calls><｜DSML｜invoke name="N">…</｜DSML｜invoke>`` or ``…name="N"/>`` (deepseek_v4)."""

    section_begin = "<｜DSML｜tool_calls>"
    section_end = "</｜DSML｜tool_calls>"

    def _start_call(self, header: str) -> None:
        super()._start_call(header)
        if self._state == "body" and header.rstrip().endswith("/"):  # <…invoke name="f"/>: no arguments, no end tag
            self._end_call()
            self._state = "between"
