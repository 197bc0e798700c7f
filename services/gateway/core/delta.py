"""``Delta``: one choice's new output, as the pipeline hands it to every front end's renderer; and the
OpenAI tool-call shapes that the chat and KServe renderers both send (streamed chunks, folded calls)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from meshfront.common.v1 import common_pb2

FINISH = {
    common_pb2.FINISH_REASON_EOS: "stop",
    common_pb2.FINISH_REASON_STOP: "stop",
    common_pb2.FINISH_REASON_LENGTH: "length",
    common_pb2.FINISH_REASON_CANCELLED: "stop",
    common_pb2.FINISH_REASON_TOOL_CALLS: "tool_calls",
}


@dataclasses.dataclass(slots=True)
class Delta:
    """New output of one choice; one is built per token, hence slots and no per-instance default lists.

    ``Pipeline._delta`` passes the fields by position: keep their order (test_render_fast_path checks
    each field by name against the pre-fast-path conversion).
    """

    index: int
    text: str = ""
    reasoning: str = ""
    # Read-only sequences: consumers iterate them, test them and extend lists from them; empty ones are ().
    tool_calls: Sequence[Any] = ()  # postprocessor ToolCallDelta messages
    logprobs: Sequence[Any] = ()  # postprocessor TokenText messages
    finish_reason: str | None = None
    stop_reason: str = ""
    completion_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    # Set on a choice's first delta: its prompt counts once per prompt, not per choice.
    counts_prompt: bool = False
    # Set when the choice moved to another worker (migration): that worker's id; also on a disaggregated
    # choice's first decoded output, the decode worker's, with the prefill worker and the transfer time.
    worker_id: str = ""
    prefill_worker_id: str = ""
    kv_transfer_ms: float = 0.0


def tool_call_chunk(call: Any) -> dict[str, Any]:
    """A streamed tool-call delta: id, type and name on a call's first delta, then argument fragments."""
    if call.name:
        return {"index": call.index, "id": call.id, "type": "function",
                "function": {"name": call.name, "arguments": call.arguments}}
    return {"index": call.index, "function": {"arguments": call.arguments}}


def fold_tool_calls(calls: list[dict[str, Any]], deltas: Sequence[Any]) -> None:
    """Folds tool-call deltas into ``calls``, each call's arguments as a list of fragments."""
    for d in deltas:
        if d.name:
            calls.append({"id": d.id, "type": "function", "function": {"name": d.name, "arguments": [d.arguments]}})
        elif calls:
            calls[-1]["function"]["arguments"].append(d.arguments)


def joined_tool_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Folded calls as the non-stream message carries them: each call's arguments one string."""
    return [{**call, "function": {"name": call["function"]["name"],
                                   "arguments": "".join(call["function"]["arguments"])}} for call in calls]
