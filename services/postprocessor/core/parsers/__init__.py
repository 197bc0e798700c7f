"""Streaming output parsers: reasoning (``reasoning/``) and tool calls (``tool_calls/``).

Every parser returns, for any split of a text into chunks, output whose concatenation equals what
it returns for the whole text at once; see ``types.py`` for the contract and docs/parsers.md for
the list of names.
"""

from services.postprocessor.core.parsers.output import OutputParser, ParserConfig, ToolChoice, build_output_parser
from services.postprocessor.core.parsers.types import ParsedDelta, ToolCallDelta

__all__ = ["OutputParser", "ParsedDelta", "ParserConfig", "ToolCallDelta", "ToolChoice", "build_output_parser"]
