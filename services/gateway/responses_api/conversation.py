"""Responses items to the chat path: messages, tools, tool_choice and text format as a ``ChatRequest``.

The conversation a response continues is the stored one (every earlier input item and output item of
the chain, store.py) followed by this request's input. Items become chat messages in order:

- ``message`` → a message of its role, its text parts joined;
- ``reasoning`` → ``reasoning_content`` of the next assistant message (chat templates render it in
  the latest turn and drop it from earlier ones, as they do for chat clients); reasoning that no
  assistant output follows has no turn to belong to and is left out;
- ``function_call`` → a tool call of the assistant message it follows (or of a new one), so that a
  reply with several calls is one assistant turn;
- ``function_call_output`` → a ``tool`` message answering ``call_id``.

``instructions`` become a leading system message; like OpenAI, the instructions of an earlier response
in the chain are not carried over.
"""

from __future__ import annotations

from typing import Any

from services.gateway.core.request import ChatRequest, Sampling
from services.gateway.responses_api.request import ResponsesRequest


def _text(parts: list[dict[str, Any]]) -> str:
    return "".join(p["text"] for p in parts)


def reasoning_text(item: dict[str, Any]) -> str:
    """A reasoning item's text: its reasoning content, else its summary."""
    return _text(item.get("content") or []) or _text(item.get("summary") or [])


def to_messages(items: list[dict[str, Any]], instructions: str | None = None) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    reasoning: list[str] = []
    # The assistant message function calls attach to; any other message closes the turn.
    turn: dict[str, Any] | None = None

    def assistant(content: str | None) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning:
            msg["reasoning_content"] = "".join(reasoning)
            reasoning.clear()
        messages.append(msg)
        return msg

    for item in items:
        kind = item["type"]
        if kind == "reasoning":
            reasoning.append(reasoning_text(item))
        elif kind == "message" and item["role"] == "assistant":
            turn = assistant(_text(item["content"]))
        elif kind == "message":
            messages.append({"role": item["role"], "content": _text(item["content"])})
            turn = None
        elif kind == "function_call":
            if turn is None:
                turn = assistant(None)
            turn.setdefault("tool_calls", []).append(
                {"id": item["call_id"], "type": "function",
                 "function": {"name": item["name"], "arguments": item["arguments"]}})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
            turn = None
        else:  # request.py admits only the kinds above; a stored record holds nothing else
            raise ValueError(f"unexpected conversation item type {kind!r}")
    return messages


def output_as_input(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output items as the input items of the next turn (ids and statuses dropped)."""
    items = []
    for item in output:
        if item["type"] == "message":
            items.append({"type": "message", "role": "assistant",
                          "content": [{"type": "output_text", "text": p["text"]} for p in item["content"]]})
        elif item["type"] == "function_call":
            items.append({"type": "function_call", "call_id": item["call_id"], "name": item["name"],
                          "arguments": item["arguments"]})
        elif item["type"] == "reasoning":
            items.append({"type": "reasoning", "summary": item["summary"], "content": item.get("content") or []})
    return items


def _chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
    return {"type": "function", "function": fn}


def _chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict):
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def _response_format(fmt: dict[str, Any]) -> dict[str, Any] | None:
    """text.format in the validated form the chat path's guided decoding takes (tools.guided_decoding)."""
    if fmt["type"] == "json_schema":
        return {"type": "json_schema", "schema": fmt["schema"]}
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    return None


def to_chat(req: ResponsesRequest, conversation: list[dict[str, Any]]) -> ChatRequest:
    """The chat request that generates this response; ``conversation`` is every input item, stored ones first."""
    kwargs = {"reasoning_effort": req.reasoning_effort} if req.reasoning_effort else {}
    sampling = Sampling(temperature=req.temperature, top_p=req.top_p, max_tokens=req.max_output_tokens)
    return ChatRequest(model=req.model, stream=req.stream, include_usage=True, n=1, sampling=sampling,
                       pins=req.pins, messages=to_messages(conversation, req.instructions),
                       tools=[_chat_tool(t) for t in req.tools] or None,
                       tool_choice=_chat_tool_choice(req.tool_choice) if req.tools else None,
                       chat_template_kwargs=kwargs, parallel_tool_calls=req.parallel_tool_calls,
                       response_format=_response_format(req.text_format))
