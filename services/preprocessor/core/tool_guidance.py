"""Tool-call guidance the preprocessor adds once a chat is rendered: the structural tag and Kimi's id count.

The worker's card says whether structural tags are on (``--dyn-structural-tag``, docs/parsers.md) and with
which scope and schema mode; the request says which tools, which choice and whether the reply may hold
several calls; the rendered prompt says whether a reasoning block is still open. Whether to send a tag is
Dynamo's rule (``should_attempt_structural_tag``):

- never with the mode off, without tools, or with ``tool_choice: none``;
- always for ``required`` and a named function (the tag replaces the generic JSON forms);
- for ``auto``: with scope ``always``, or when a tool says ``strict: true`` or ``parallel_tool_calls`` is
  false; and never over a constraint the client set itself (``response_format``, ``structured_outputs``),
  which takes precedence over automatic tool guidance, as in Dynamo.
"""

from __future__ import annotations

import dataclasses

import orjson

from services.preprocessor.core import structural_tag

MODE_OFF, MODE_ON = "off", "on"
SCOPE_AUTO, SCOPE_ALWAYS = "auto", "always"


@dataclasses.dataclass(frozen=True)
class ToolRequest:
    """What of a chat request decides its tool guidance.

    Attributes:
        tools_json: the request's tools (OpenAI JSON), "" for none.
        choice: ``structural_tag.AUTO``, ``REQUIRED`` or ``NAMED``, or "none".
        named_function: the function of a NAMED choice.
        single_call: ``parallel_tool_calls`` was false.
        client_constraint: the request carries a constraint of the client's own (an AUTO choice's guidance
            is the client's; a forced one's is the gateway's generic JSON form).
        reasoning_open: the rendered prompt leaves a ``<think>`` block open and thinking is on.
    """

    tools_json: str
    choice: str
    named_function: str = ""
    single_call: bool = False
    client_constraint: bool = False
    reasoning_open: bool = False


def structural_tag_json(tool_call_parser: str, mode: str, scope: str, schema_mode: str,
                        req: ToolRequest) -> str | None:
    """The structural tag (JSON text) the worker is to decode with, or None for none."""
    if mode != MODE_ON or not req.tools_json or req.choice == "none" or not structural_tag.has_format(
            tool_call_parser):
        return None
    if req.choice == structural_tag.AUTO and req.client_constraint:
        return None
    tools = orjson.loads(req.tools_json)
    if req.choice == structural_tag.AUTO and scope != SCOPE_ALWAYS and not req.single_call and not any(
            t.get("function", {}).get("strict") is True for t in tools):
        return None
    tag = structural_tag.build(tool_call_parser, tools, req.choice, req.named_function, single_call=req.single_call,
                               schema_mode=schema_mode, reasoning_open=req.reasoning_open)
    return orjson.dumps(tag).decode() if tag is not None else None


def history_tool_calls(messages_json: str) -> int:
    """Tool calls in the assistant messages of a chat (Kimi's call ids count on from it, as SGLang's and vLLM's
    ``history_tool_calls_count``). Most chats have none: those are told apart without decoding them."""
    if '"tool_calls"' not in messages_json:
        return 0
    messages = orjson.loads(messages_json)
    return sum(len(m["tool_calls"]) for m in messages
               if isinstance(m, dict) and m.get("role") == "assistant" and isinstance(m.get("tool_calls"), list))
