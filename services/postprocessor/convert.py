"""Conversions between the wire types (protobuf) and the postprocessor core (plain Python)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from meshfront.common.v1 import common_pb2
from meshfront.postprocessor.v1 import postprocessor_pb2
from services.postprocessor.core.detokenizer import PROMPT_CONTEXT_IDS
from services.postprocessor.core.logprobs import TokenTexts
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


_TOOL_CHOICES = {common_pb2.TOOL_CHOICE_MODE_UNSPECIFIED: "auto", common_pb2.TOOL_CHOICE_MODE_AUTO: "auto",
                 common_pb2.TOOL_CHOICE_MODE_NONE: "none", common_pb2.TOOL_CHOICE_MODE_REQUIRED: "required",
                 common_pb2.TOOL_CHOICE_MODE_NAMED: "named"}


def tool_choice_from_proto(choice: common_pb2.ToolChoice) -> tuple[str, str]:
    """(mode as the parsers name it, the named function); unset is "auto", as without tools it is moot."""
    return _TOOL_CHOICES[choice.mode], choice.function_name


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
