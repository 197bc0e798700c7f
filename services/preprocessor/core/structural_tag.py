"""Structural tags: tool calls constrained in the model's own call format (xgrammar's ``structural_tag``).

A structural tag is the JSON that vLLM's structured outputs (``StructuredOutputsParams.structural_tag``) and
SGLang's ``structural_tag`` sampling parameter hand to xgrammar: free text where the model may write text,
and inside each call the exact markup of the model's format with the arguments held to the function's
parameters schema. It replaces the generic JSON forms (an array of ``{"name", "parameters"}``) that guided
decoding otherwise forces for ``tool_choice`` required / named, so the model writes calls the way it was
trained to and the model's own tool-call parser reads them.

The shapes follow the builders vLLM 0.32 and xgrammar ship for these formats (``hermes``, ``llama``,
``qwen_3_coder``, ``kimi``, ``deepseek_r1``, ``deepseek_v3_1``, ``minimax``), which is what Dynamo's vLLM chat
processor sends. Per ``tool_choice``:

- ``auto``: ``triggered_tags``: any text; once the model writes the format's trigger, a whole call (or
  section of calls) of one of the offered functions;
- ``required``: only calls, at least one, from the first token on;
- named: only calls of that function.

``parallel_tool_calls: false`` stops after the first call. A format whose prompt leaves a reasoning block
open gets the reasoning first (any text up to its end marker). Formats without a shape here get no tag:
``build`` returns None and the request keeps the guidance it had.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

AUTO, REQUIRED, NAMED = "auto", "required", "named"
SCHEMA_AUTO, SCHEMA_STRICT = "auto", "strict"


@dataclasses.dataclass(frozen=True)
class CallFormat:
    """One tool-call format's markup around a call: ``call_begin NAME name_end ARGUMENTS call_end``.

    Attributes:
        call_begins: what opens a call, up to the function name (several: each is accepted).
        name_end: what follows the name, up to the arguments (with ``index_pattern``: after the index).
        call_end: what closes a call (one per ``call_begins``).
        trigger: what starts a call, or a section of calls, in free text (a prefix of every call's begin).
        style: xgrammar's argument syntax: ``json``, or the XML styles of the formats that write raw values.
        section: (begin, end) around all of a reply's calls; None when calls stand alone.
        index_pattern: a regex between the name and ``name_end`` (Kimi's call index), "" for none.
    """

    call_begins: tuple[str, ...]
    name_end: str
    call_ends: tuple[str, ...]
    trigger: str
    style: str = "json"
    section: tuple[str, str] | None = None
    index_pattern: str = ""


_HERMES = CallFormat(('<tool_call>\n{"name": "', '<tool_call>{"name": "'), '", "arguments": ',
                     ("}\n</tool_call>", "}</tool_call>"), "<tool_call>")
_QWEN3_CODER = CallFormat(("<tool_call>\n<function=",), ">\n", ("\n</function>\n</tool_call>",),
                          "<tool_call>\n<function=", style="qwen_xml")
_DEEPSEEK_SECTION = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")

# Our tool-call parser names (services/common/parser_names.py) -> their format. A name not here has none.
FORMATS: dict[str, CallFormat] = {
    **dict.fromkeys(("hermes", "qwen", "qwen25", "qwen3"), _HERMES),
    **dict.fromkeys(("llama3_json", "llama"),
                    CallFormat(('{"name": "',), '", "parameters": ', ("}",), '{"name": ')),
    **dict.fromkeys(("qwen3_coder", "nemotron_nano"), _QWEN3_CODER),
    **dict.fromkeys(("kimi_k2", "kimi_k25"),
                    CallFormat(("<|tool_call_begin|>functions.",), "<|tool_call_argument_begin|>",
                               ("<|tool_call_end|>",), "<|tool_calls_section_begin|>",
                               section=("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"),
                               index_pattern=r":\d+")),
    **dict.fromkeys(("deepseek_v3", "deepseek_r1"),
                    CallFormat(("<｜tool▁call▁begin｜>function<｜tool▁sep｜>",), "\n```json\n",
                               ("\n```<｜tool▁call▁end｜>",), _DEEPSEEK_SECTION[0], section=_DEEPSEEK_SECTION)),
    **dict.fromkeys(("deepseek_v3_1", "deepseek_v31"),
                    CallFormat(("<｜tool▁call▁begin｜>",), "<｜tool▁sep｜>", ("<｜tool▁call▁end｜>",),
                               _DEEPSEEK_SECTION[0], section=_DEEPSEEK_SECTION)),
    "minimax_m2": CallFormat(('<invoke name="',), '">\n', ("</invoke>\n",), "<minimax:tool_call>",
                             style="minimax_xml", section=("<minimax:tool_call>\n", "</minimax:tool_call>")),
}

# A prompt that ends inside an opened ``<think>`` block (templates.prompt_opens_reasoning) gets the rest of the
# reasoning first: any text up to this marker, as Dynamo's ``starts_in_reasoning``.
THINK_END = "</think>"


def has_format(tool_call_parser: str) -> bool:
    return tool_call_parser in FORMATS


def effective_strict(tool_strict: Any, schema_mode: str) -> bool:
    """Whether a tool's arguments are held to its schema: ``schema strict`` always; ``auto`` unless the tool
    says ``strict: false`` (Dynamo's ``effective_tool_strict``)."""
    return schema_mode == SCHEMA_STRICT or tool_strict is not False


def build(tool_call_parser: str, tools: Sequence[dict[str, Any]], choice: str, named_function: str = "", *,
          single_call: bool = False, schema_mode: str = SCHEMA_AUTO, reasoning_open: bool = False
          ) -> dict[str, Any] | None:
    """The structural tag for a request, or None when the format has none (or no tool can be called).

    Args:
        tool_call_parser: the model's format (its worker's ``--tool-call-parser``).
        tools: the request's tools, OpenAI JSON (``{"type": "function", "function": {...}}``).
        choice: AUTO, REQUIRED or NAMED (``named_function`` names the function).
        single_call: ``parallel_tool_calls`` was false.
        schema_mode: SCHEMA_AUTO or SCHEMA_STRICT (``effective_strict``).
        reasoning_open: the prompt leaves a ``<think>`` block open (and thinking is on).
    """
    fmt = FORMATS.get(tool_call_parser)
    functions = [t["function"] for t in tools if t.get("type") == "function"]
    if choice == NAMED:
        functions = [f for f in functions if f["name"] == named_function]
    if fmt is None or not functions:
        return None
    calls = [tag for f in functions for tag in _call_tags(fmt, f, schema_mode)]
    body = _auto(fmt, calls, single_call) if choice == AUTO else _forced(fmt, calls, single_call)
    if reasoning_open:
        body = {"type": "sequence", "elements": [
            {"type": "tag", "begin": "", "content": {"type": "any_text"}, "end": THINK_END}, body]}
    return {"type": "structural_tag", "format": body}


def _call_tags(fmt: CallFormat, function: dict[str, Any], schema_mode: str) -> list[dict[str, Any]]:
    schema: Any = True  # any JSON value: the call's markup is still enforced, its arguments are not
    if effective_strict(function.get("strict"), schema_mode) and function.get("parameters") is not None:
        schema = function["parameters"]
    arguments: dict[str, Any] = {"type": "json_schema", "json_schema": schema, "style": fmt.style}
    content = arguments if not fmt.index_pattern else {"type": "sequence", "elements": [
        {"type": "regex", "pattern": fmt.index_pattern}, {"type": "const_string", "value": fmt.name_end},
        arguments]}
    name_end = "" if fmt.index_pattern else fmt.name_end
    return [{"type": "tag", "begin": begin + function["name"] + name_end, "content": content, "end": end}
            for begin, end in zip(fmt.call_begins, fmt.call_ends, strict=True)]


def _calls(tags: list[dict[str, Any]], single_call: bool) -> dict[str, Any]:
    """One or more calls back to back, and nothing else."""
    return {"type": "tags_with_separator", "tags": tags, "separator": "", "at_least_one": True,
            "stop_after_first": single_call}


def _auto(fmt: CallFormat, calls: list[dict[str, Any]], single_call: bool) -> dict[str, Any]:
    tags = calls if fmt.section is None else [
        {"type": "tag", "begin": fmt.section[0], "content": _calls(calls, single_call), "end": fmt.section[1]}]
    return {"type": "triggered_tags", "triggers": [fmt.trigger], "tags": tags, "stop_after_first": single_call}


def _forced(fmt: CallFormat, calls: list[dict[str, Any]], single_call: bool) -> dict[str, Any]:
    if fmt.section is None:
        return _calls(calls, single_call)
    return {"type": "sequence", "elements": [{"type": "const_string", "value": fmt.section[0]},
                                             _calls(calls, single_call),
                                             {"type": "const_string", "value": fmt.section[1]}]}
