"""Conversions between the wire types (protobuf) and the postprocessor core (plain Python)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from meshfront.common.v1 import common_pb2
from meshfront.postprocessor.v1 import postprocessor_pb2

from services.postprocessor.core.detokenizer import PROMPT_CONTEXT_IDS
from services.postprocessor.core.logprobs import TokenTexts
from services.postprocessor.core.parsers import ParserConfig, ToolChoice
from services.postprocessor.core.sequence import FinishReason, SequenceOptions

_UNSPECIFIED = common_pb2.FINISH_REASON_UNSPECIFIED


def sequence_options(request: common_pb2.PreprocessedRequest) -> SequenceOptions:
    """The stop and output options of a preprocessed request.

    With ``ignore_eos`` no id is hidden (the engine keeps generating through EOS). Otherwise both the
    hidden stop ids and the engine's EOS ids are hidden: the engine includes the EOS id it stopped on
    in its last chunk, and its text must not reach the client.
    """
    stop = request.stop
    hidden: frozenset[int] = frozenset()
    if not stop.ignore_eos:
        hidden = frozenset(stop.stop_token_ids_hidden) | frozenset(request.eos_token_ids)
    return SequenceOptions(
        prompt_ids=list(request.token_ids[-PROMPT_CONTEXT_IDS:]),
        stop_strings=tuple(stop.stop),
        include_stop_str=stop.include_stop_str_in_output,
        hidden_stop_ids=hidden,
        min_tokens=stop.min_tokens,
        skip_special_tokens=request.output.skip_special_tokens,
    )


def finish_from_proto(value: int) -> FinishReason | None:
    """The core finish reason of a worker message; None while the sequence goes on."""
    return None if value == _UNSPECIFIED else FinishReason(value)


_TOOL_CHOICES = {common_pb2.TOOL_CHOICE_MODE_UNSPECIFIED: ToolChoice.AUTO,
                 common_pb2.TOOL_CHOICE_MODE_AUTO: ToolChoice.AUTO,
                 common_pb2.TOOL_CHOICE_MODE_NONE: ToolChoice.NONE,
                 common_pb2.TOOL_CHOICE_MODE_REQUIRED: ToolChoice.REQUIRED,
                 common_pb2.TOOL_CHOICE_MODE_NAMED: ToolChoice.NAMED}


def parser_config(options: common_pb2.PostprocessOptions, auto_tool_choice: bool = False) -> ParserConfig:
    """What selects a request's parsers. Tools are offered exactly when ``tools_json`` is set (the gateway
    sets it only for a non-empty list): no second decode of the JSON for that. An unset tool choice is
    AUTO, as OpenAI's default with tools (without tools it is moot). ``auto_tool_choice``
    (--enable-auto-tool-choice): the model's tool calls are parsed even when the request offered no tools."""
    choice = _TOOL_CHOICES[options.tool_choice.mode]
    return ParserConfig(options.tool_call_parser, options.reasoning_parser,
                        has_tools=bool(options.tools_json) or (auto_tool_choice and choice is ToolChoice.AUTO),
                        tool_choice=choice,
                        named_function=options.tool_choice.function_name,
                        prompt_opens_reasoning=options.prompt_opens_reasoning,
                        thinking_disabled=options.thinking_disabled,
                        history_tool_calls=options.history_tool_calls,
                        forced_in_model_format=options.tool_calls_in_model_format)


def finish_to_proto(finish: FinishReason | None) -> common_pb2.FinishReason:
    # The values are equal by construction (services/workers/engine.py); the stubs type enums as classes.
    return cast(common_pb2.FinishReason, _UNSPECIFIED if finish is None else int(finish))


def token_texts(logprobs: Sequence[common_pb2.TokenLogprob], texts: TokenTexts) -> list[postprocessor_pb2.TokenText]:
    """Worker logprobs (ids) as response logprobs (token strings)."""
    out = []
    for lp in logprobs:
        top = [postprocessor_pb2.TopTokenText(token=texts.text(t.token_id), logprob=t.logprob) for t in lp.top]
        out.append(postprocessor_pb2.TokenText(token=texts.text(lp.token_id), logprob=lp.logprob, top=top))
    return out
