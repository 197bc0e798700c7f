"""OpenAI messages and tools reshaped into what chat templates expect (dynamo-frontend.md §3.2).

- Keys whose value is null are dropped (transformers does the same: templates handle a missing
  key but render ``None`` literally).
- Text-only content arrays become one string joined with newlines; media parts become
  ``{"type": "image"|"video"|"audio"}`` placeholders when the template renders them, else the
  content is its text parts joined (the media travel beside the prompt to the worker).
- Assistant tool-call arguments given as JSON strings are parsed into objects, so templates that
  ``tojson`` them do not double-encode.
- Assistant ``reasoning_content`` becomes a ``<think>…</think>`` prefix of the content, unless the
  template reads ``reasoning_content`` itself.
- Tool ``parameters`` missing ``type``/``properties`` get ``"object"``/``{}``.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson

from services.common.errors import InvalidRequest

_MEDIA_PARTS = {"image_url": "image", "input_image": "image", "video_url": "video", "audio_url": "audio",
                "input_audio": "audio"}
_TEXT_PARTS = ("text", "input_text", "output_text")


def parse_json(raw: str, what: str, param: str) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise InvalidRequest(f"{what} is not valid JSON: {e}", param=param) from e


def _flatten_content(content: list[Any], media_parts: bool) -> str | list[dict]:
    parts: list[dict] = []
    for part in content:
        if isinstance(part, str):
            parts.append({"type": "text", "text": part})
            continue
        if not isinstance(part, dict):
            raise InvalidRequest("message content parts must be objects", param="messages")
        kind = part.get("type")
        if kind in _TEXT_PARTS or (kind is None and "text" in part):
            parts.append({"type": "text", "text": str(part.get("text", ""))})
        elif kind in _MEDIA_PARTS:
            parts.append({"type": _MEDIA_PARTS[kind]})
        else:
            raise InvalidRequest(f"unsupported content part type {kind!r}", param="messages")
    if not media_parts or all(p["type"] == "text" for p in parts):
        # A template that expects string content gets the text; the media reach the worker as
        # PreprocessedRequest.media, whose engine places them.
        return "\n".join(p["text"] for p in parts if p["type"] == "text")
    return parts


def _parse_arguments(tool_calls: list[Any]) -> list[Any]:
    out = []
    for call in tool_calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
            try:
                args = orjson.loads(fn["arguments"]) if fn["arguments"].strip() else {}
            except orjson.JSONDecodeError:
                args = fn["arguments"]  # not JSON: let the template render the string as given
            call = {**call, "function": {**fn, "arguments": args}}
        out.append(call)
    return out


def _normalise_message(message: dict, template_reads_reasoning: bool, media_parts: bool) -> dict:
    msg = {k: v for k, v in message.items() if v is not None}
    if msg.get("role") == "developer":
        # OpenAI's newer name for system instructions; most templates only know "system",
        # and a template that skips unknown roles would silently drop the message.
        msg["role"] = "system"
    if isinstance(msg.get("content"), list):
        msg["content"] = _flatten_content(msg["content"], media_parts)
    if msg.get("role") == "assistant":
        if isinstance(msg.get("tool_calls"), list):
            msg["tool_calls"] = _parse_arguments(msg["tool_calls"])
        reasoning = msg.get("reasoning_content")
        if isinstance(reasoning, str) and not template_reads_reasoning:
            del msg["reasoning_content"]
            content = msg.get("content") if isinstance(msg.get("content"), str) else ""
            msg["content"] = f"<think>{reasoning}</think>{content}"
    return msg


def normalise_messages(raw: Any, template_reads_reasoning: bool, media_parts: bool = True) -> list[dict]:
    """Validates the shape of ``messages`` and returns normalised copies.

    ``media_parts``: the template renders image/audio parts; otherwise content becomes its text.
    """
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest("messages must be a non-empty array", param="messages")
    out = []
    for message in raw:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InvalidRequest("each message must be an object with a string role", param="messages")
        out.append(_normalise_message(message, template_reads_reasoning, media_parts))
    return out


def normalise_tools(raw: Any) -> list[dict]:
    """Tools as the template sees them; parameters always carry ``type`` and ``properties``."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise InvalidRequest("tools must be an array", param="tools")
    out = []
    for tool in raw:
        if not isinstance(tool, dict):
            raise InvalidRequest("each tool must be an object", param="tools")
        tool = copy.deepcopy(tool)
        fn = tool.get("function")
        if isinstance(fn, dict):
            params = fn.get("parameters")
            if not isinstance(params, dict):
                params = {}
            params.setdefault("type", "object")
            params.setdefault("properties", {})
            fn["parameters"] = params
        out.append(tool)
    return out

