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
from collections.abc import Mapping
from typing import Any

import orjson

from services.common.errors import InvalidRequest

# The gateway owns validation (services/gateway/core/openai_request.py and core/media.py, for every API it
# speaks): what reaches the preprocessor is well-formed, and this module only normalises it for the
# template. Text-like parts keep their text under these keys; media parts become placeholders.
_TEXT_KEYS = {"text": "text", "refusal": "refusal"}
_MEDIA_PARTS = {"image_url": "image", "video_url": "video", "input_audio": "audio"}


def parse_json(raw: str, what: str, param: str) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise InvalidRequest(f"{what} is not valid JSON: {e}", param=param) from e


def _flatten_content(content: list[dict], media_parts: bool, markers: Mapping[str, str]) -> str | list[dict]:
    parts = [{"type": "text", "text": part[_TEXT_KEYS[part["type"]]]} if part["type"] in _TEXT_KEYS
             else {"type": _MEDIA_PARTS[part["type"]]} for part in content]
    if not media_parts or all(p["type"] == "text" for p in parts):
        # A template that expects string content gets the text, with each medium the model has a placeholder
        # for standing where it was (``markers``, media/placement.py); the rest reach the worker as
        # PreprocessedRequest.media unplaced, and its engine places them.
        return "\n".join(p["text"] if p["type"] == "text" else markers[p["type"]] for p in parts
                         if p["type"] == "text" or p["type"] in markers)
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


def _normalise_message(message: dict, template_reads_reasoning: bool, media_parts: bool,
                       markers: Mapping[str, str]) -> dict:
    msg = {k: v for k, v in message.items() if v is not None}
    if msg.get("role") == "developer":
        # OpenAI's newer name for system instructions; most templates only know "system",
        # and a template that skips unknown roles would silently drop the message.
        msg["role"] = "system"
    if isinstance(msg.get("content"), list):
        msg["content"] = _flatten_content(msg["content"], media_parts, markers)
    if msg.get("role") == "assistant":
        if isinstance(msg.get("tool_calls"), list):
            msg["tool_calls"] = _parse_arguments(msg["tool_calls"])
        if msg.get("reasoning_content") is None and isinstance(msg.get("reasoning"), str):
            # The field a client got with --reasoning-field-name reasoning (and vLLM's name), sent back as is.
            msg["reasoning_content"] = msg.pop("reasoning")
        reasoning = msg.get("reasoning_content")
        if isinstance(reasoning, str) and not template_reads_reasoning:
            del msg["reasoning_content"]
            content = msg.get("content") if isinstance(msg.get("content"), str) else ""
            msg["content"] = f"<think>{reasoning}</think>{content}"
    return msg


def normalise_messages(messages: list[dict], template_reads_reasoning: bool, media_parts: bool = True,
                       markers: Mapping[str, str] | None = None) -> list[dict]:
    """Normalised copies of ``messages`` (validated by the gateway).

    ``media_parts``: the template renders image/video/audio parts; otherwise content becomes its text, with
    ``markers[modality]`` (the model's placeholder text) where each medium it names was.
    """
    return [_normalise_message(m, template_reads_reasoning, media_parts, markers or {}) for m in messages]


def normalise_tools(tools: list[dict] | None) -> list[dict]:
    """Tools (validated by the gateway) as the template sees them: parameters always carry ``type`` and
    ``properties``."""
    if tools is None:
        return []
    out = []
    for tool in tools:
        tool = copy.deepcopy(tool)
        fn = tool["function"]
        params = fn.get("parameters")
        params = dict(params) if isinstance(params, dict) else {}
        params.setdefault("type", "object")
        params.setdefault("properties", {})
        fn["parameters"] = params
        out.append(tool)
    return out
