"""NVIDIA Nemotron (Llama-Nemotron Super/Ultra, "Deci") tool calls: ``<TOOLCALL>[{…}, …]</TOOLCALL>``.

The Llama-3.x-Nemotron templates ask for a JSON list of calls between ``<TOOLCALL>`` and
``</TOOLCALL>`` (Dynamo's ``nemotron_deci``); a single object without the list is read too.
"""

from __future__ import annotations

from services.postprocessor.core.parsers.tool_calls.wrapped_json import WrappedJsonToolParser


class NemotronDeciToolParser(WrappedJsonToolParser):
    start_tags = ("<TOOLCALL>",)
    end_tag = "</TOOLCALL>"
