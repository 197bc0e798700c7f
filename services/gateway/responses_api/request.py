"""Parses and validates a ``POST /v1/responses`` body into a ``ResponsesRequest``.

Every field is either carried to the mesh, echoed back as bookkeeping, or refused with a 400 naming
it: built-in tools, ``background: true``, image/file/audio inputs and anything unknown. Input items
come out normalized (``items``), in the shape they are stored in and continued from: a string input
is one user message; message content is a list of text parts; ``function_call_output.output`` is a
string; a reasoning item keeps its text.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from services.common.errors import InvalidRequest
from services.gateway.core.fields import UINT32, Fields
from services.gateway.core.pins import Pins, read_pins
from services.gateway.core.request import load_json
from services.gateway.core.tools import check_schema

ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text")
UNSUPPORTED_PARTS = ("input_image", "input_file", "input_audio")
REASONING_EFFORTS = ("minimal", "low", "medium", "high")
# Longer than any id a server mints (OpenAI's are ~50 characters): refused before a lookup echoes it.
MAX_RESPONSE_ID = 128
# OpenAI's function names (the chat path's rule).
_FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
# Accepted and echoed back; they change nothing about generation.
_BOOKKEEPING = ("user", "safety_identifier", "service_tier", "prompt_cache_key")
# Fields of the API this server does not implement: a 400 that names them rather than "unknown".
_UNSUPPORTED = {"prompt": "prompt templates", "conversation": "the Conversations API",
                "max_tool_calls": "'max_tool_calls' (tools run on the client here)",
                "top_logprobs": "'top_logprobs'", "context_management": "'context_management'"}


@dataclasses.dataclass
class ResponsesRequest:
    model: str
    items: list[dict[str, Any]]
    instructions: str | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    # Function tools in the Responses shape ({"type": "function", "name", ...}).
    tools: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    # {"type": "text"} | {"type": "json_object"} | {"type": "json_schema", "name", "schema", ...}
    text_format: dict[str, Any] = dataclasses.field(default_factory=lambda: {"type": "text"})
    reasoning_effort: str | None = None
    metadata: dict[str, str] = dataclasses.field(default_factory=dict)
    # The bookkeeping fields as sent, echoed in the response object.
    bookkeeping: dict[str, Any] = dataclasses.field(default_factory=dict)
    pins: Pins = Pins()  # the x-worker-instance-id and x-prefill-instance-id headers (no nvext here)


def _text_part(f: Fields, where: str) -> dict[str, Any]:
    kind = f.str("type", required=True)
    if kind in UNSUPPORTED_PARTS:
        raise InvalidRequest(f"'{where}.type' {kind!r}: image, file and audio inputs are not supported; "
                             "only text parts (input_text, output_text)", param=f"{where}.type")
    if kind not in TEXT_PARTS:
        raise InvalidRequest(f"'{where}.type' must be one of {', '.join(TEXT_PARTS)}; got {kind!r}",
                             param=f"{where}.type")
    text = f.str("text")
    if text is None:
        raise InvalidRequest(f"'{where}.text' is required", param=f"{where}.text")
    if kind == "output_text":
        f.raw("annotations")  # citations of an earlier output, handed back as context: nothing to act on
        f.raw("logprobs")
    f.reject_unknown()
    return {"type": kind, "text": text}


def _message(f: Fields, where: str) -> dict[str, Any]:
    role = f.str("role", required=True, allowed=ROLES)
    content = f.raw("content")
    if isinstance(content, str):
        parts = [{"type": "output_text" if role == "assistant" else "input_text", "text": content}]
    elif isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict):
                raise InvalidRequest(f"'{where}.content[{j}]' must be an object", param=f"{where}.content[{j}]")
            parts.append(_text_part(Fields(part, f"{where}.content[{j}]."), f"{where}.content[{j}]"))
    else:
        raise InvalidRequest(f"'{where}.content' must be a string or an array of content parts",
                             param=f"{where}.content")
    f.raw("id")  # an earlier output item handed back carries its id and status
    f.raw("status")
    return {"type": "message", "role": role, "content": parts}


def _function_call(f: Fields, where: str) -> dict[str, Any]:
    item = {"type": "function_call", "call_id": f.str("call_id", required=True),
            "name": f.str("name", required=True), "arguments": f.str("arguments", required=True)}
    f.raw("id")
    f.raw("status")
    return item


def _function_call_output(f: Fields, where: str) -> dict[str, Any]:
    call_id = f.str("call_id", required=True)
    output = f.raw("output")
    if isinstance(output, list):  # text parts; anything else is refused by _text_part
        texts = []
        for j, part in enumerate(output):
            if not isinstance(part, dict):
                raise InvalidRequest(f"'{where}.output[{j}]' must be an object", param=f"{where}.output[{j}]")
            texts.append(_text_part(Fields(part, f"{where}.output[{j}]."), f"{where}.output[{j}]")["text"])
        output = "".join(texts)
    if not isinstance(output, str):
        raise InvalidRequest(f"'{where}.output' must be a string or an array of text parts", param=f"{where}.output")
    f.raw("id")
    f.raw("status")
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def _texts(f: Fields, key: str, kind: str, where: str) -> list[str]:
    parts = f.list(key) or []
    out = []
    for j, p in enumerate(parts):
        pf = Fields(p if isinstance(p, dict) else {}, f"{where}.{key}[{j}].")
        if not isinstance(p, dict) or pf.str("type") != kind or pf.str("text") is None:
            raise InvalidRequest(f"'{where}.{key}[{j}]' must be {{\"type\": \"{kind}\", \"text\": ...}}",
                                 param=f"{where}.{key}[{j}]")
        pf.reject_unknown()
        out.append(p["text"])
    return out


def _reasoning(f: Fields, where: str) -> dict[str, Any]:
    content = _texts(f, "content", "reasoning_text", where)
    summary = _texts(f, "summary", "summary_text", where)
    if f.raw("encrypted_content") is not None:
        raise InvalidRequest(f"'{where}.encrypted_content': encrypted reasoning is not supported",
                             param=f"{where}.encrypted_content")
    f.raw("id")
    f.raw("status")
    return {"type": "reasoning", "summary": [{"type": "summary_text", "text": t} for t in summary],
            "content": [{"type": "reasoning_text", "text": t} for t in content]}


_ITEMS = {"message": _message, "function_call": _function_call, "function_call_output": _function_call_output,
          "reasoning": _reasoning}


def parse_items(value: Any) -> list[dict[str, Any]]:
    """``input`` as normalized items; a string is one user message."""
    if isinstance(value, str):
        if not value:
            raise InvalidRequest("'input' must not be empty", param="input")
        return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": value}]}]
    if not isinstance(value, list) or not value:
        raise InvalidRequest("'input' must be a non-empty string or a non-empty array of input items", param="input")
    items = []
    for i, raw in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(raw, dict):
            raise InvalidRequest(f"'{where}' must be an object", param=where)
        f = Fields(raw, f"{where}.")
        # An "easy" message ({"role", "content"}) has no type.
        kind = f.str("type") or ("message" if "role" in raw else None)
        parse = _ITEMS.get(kind or "")
        if parse is None:
            raise InvalidRequest(f"'{where}.type' must be one of {', '.join(_ITEMS)}; got {kind!r} "
                                 "(built-in tool calls and item references are not supported)", param=f"{where}.type")
        items.append(parse(f, where))
        f.reject_unknown()
    return items


def _tool(i: int, tool: Any) -> dict[str, Any]:
    where = f"tools[{i}]"
    if not isinstance(tool, dict):
        raise InvalidRequest(f"'{where}' must be an object", param=where)
    f = Fields(tool, f"{where}.")
    kind = f.str("type", required=True)
    if kind != "function":
        raise InvalidRequest(f"'{where}.type' {kind!r}: built-in tools are not supported; only function tools",
                             param=f"{where}.type")
    name = f.str("name", required=True)
    if not _FUNCTION_NAME.match(name or ""):
        raise InvalidRequest(f"'{where}.name' must be 1-64 letters, digits, '_', '.' or '-'", param=f"{where}.name")
    out: dict[str, Any] = {"type": "function", "name": name}
    description = f.str("description")
    if description is not None:
        out["description"] = description
    parameters = f.obj("parameters")
    if parameters is not None:
        check_schema(parameters, f"{where}.parameters")
        out["parameters"] = parameters
    strict = f.raw("strict")
    if strict is not None:
        out["strict"] = f.bool("strict")
    f.reject_unknown()
    return out


def _tools(value: list[Any] | None) -> list[dict[str, Any]]:
    tools = [_tool(i, t) for i, t in enumerate(value or [])]
    names = [t["name"] for t in tools]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise InvalidRequest(f"'tools[{i}].name' {name!r} is defined twice", param=f"tools[{i}].name")
    return tools


def _tool_choice(value: Any, tools: list[dict[str, Any]]) -> Any:
    if value is None:
        return "auto"
    if isinstance(value, str):
        if value not in ("none", "auto", "required"):
            raise InvalidRequest(f"'tool_choice' must be none, auto, required or {{\"type\": \"function\", "
                                 f"\"name\": ...}}; got {value!r}", param="tool_choice")
        if value == "required" and not tools:
            raise InvalidRequest("'tool_choice' 'required' needs 'tools'", param="tool_choice")
        return value
    if not isinstance(value, dict):
        raise InvalidRequest("'tool_choice' must be a string or an object", param="tool_choice")
    f = Fields(value, "tool_choice.")
    kind = f.str("type", required=True)
    if kind != "function":
        raise InvalidRequest(f"'tool_choice.type' {kind!r} is not supported; only function tools",
                             param="tool_choice.type")
    name = f.str("name", required=True)
    f.reject_unknown()
    if name not in {t["name"] for t in tools}:
        raise InvalidRequest(f"'tool_choice' names function {name!r}, which is not in 'tools'", param="tool_choice")
    return {"type": "function", "name": name}


def _text_format(text: dict[str, Any] | None) -> dict[str, Any]:
    if text is None:
        return {"type": "text"}
    tf = Fields(text, "text.")
    fmt = tf.obj("format")
    tf.reject_unknown()
    if fmt is None:
        return {"type": "text"}
    f = Fields(fmt, "text.format.")
    kind = f.str("type", required=True, allowed=("text", "json_object", "json_schema"))
    if kind != "json_schema":
        f.reject_unknown()
        return {"type": kind}
    out: dict[str, Any] = {"type": "json_schema", "name": f.str("name", required=True)}
    schema = f.obj("schema")
    if schema is None:
        raise InvalidRequest("'text.format.schema' is required for json_schema", param="text.format.schema")
    check_schema(schema, "text.format.schema")
    out["schema"] = schema
    description = f.str("description")
    if description is not None:
        out["description"] = description
    if f.raw("strict") is not None:
        out["strict"] = f.bool("strict")
    f.reject_unknown()
    return out


def _metadata(value: dict[str, Any] | None) -> dict[str, str]:
    """OpenAI's rule: at most 16 string pairs, keys up to 64 characters, values up to 512."""
    meta = value or {}
    if len(meta) > 16:
        raise InvalidRequest("'metadata' may hold at most 16 keys", param="metadata")
    for k, v in meta.items():
        if len(k) > 64 or not isinstance(v, str) or len(v) > 512:
            raise InvalidRequest(f"'metadata.{k}' must be a string of at most 512 characters under a key of at "
                                 "most 64", param=f"metadata.{k}")
    return dict(meta)


def parse_responses(raw: bytes, headers: dict[str, str] | None = None) -> ResponsesRequest:
    body = load_json(raw)
    f = Fields(body)
    for key, what in _UNSUPPORTED.items():
        if body.get(key) is not None:
            raise InvalidRequest(f"'{key}' is not supported by this server ({what})", param=key)
    if f.bool("background"):
        raise InvalidRequest("'background' responses are not supported; use 'stream' instead", param="background")
    model = f.str("model", required=True)
    if f.raw("input") is None:
        raise InvalidRequest("'input' is required", param="input")
    req = ResponsesRequest(model=model or "", items=parse_items(body["input"]))
    req.instructions = f.str("instructions")
    req.stream = f.bool("stream")
    req.store = f.bool("store", True)
    previous = f.str("previous_response_id")
    if previous is not None and not previous:
        raise InvalidRequest("'previous_response_id' must not be empty", param="previous_response_id")
    if previous is not None and len(previous) > MAX_RESPONSE_ID:  # ours are 37 ("resp_" + 32 hex)
        raise InvalidRequest(f"'previous_response_id' is {len(previous)} characters; a response id has at most "
                             f"{MAX_RESPONSE_ID}", param="previous_response_id")
    req.previous_response_id = previous
    req.tools = _tools(f.list("tools"))
    req.tool_choice = _tool_choice(f.raw("tool_choice"), req.tools)
    req.parallel_tool_calls = f.bool("parallel_tool_calls", True)
    req.max_output_tokens = f.int("max_output_tokens", UINT32, 1)
    req.temperature = f.float("temperature", 0.0, 2.0)
    req.top_p = f.float("top_p", 0.0, 1.0)
    req.text_format = _text_format(f.obj("text"))
    reasoning = f.obj("reasoning")
    if reasoning is not None:
        rf = Fields(reasoning, "reasoning.")
        req.reasoning_effort = rf.str("effort", allowed=REASONING_EFFORTS)
        rf.reject_unknown()
    req.metadata = _metadata(f.obj("metadata"))
    for key in _BOOKKEEPING:
        value = f.str(key)
        if value is not None:
            req.bookkeeping[key] = value
    truncation = f.str("truncation", allowed=("disabled",))
    if truncation is not None:
        req.bookkeeping["truncation"] = truncation
    include = f.list("include")
    if include:
        raise InvalidRequest(f"'include' {include!r} is not supported: no encrypted reasoning, logprobs or "
                             "built-in tool outputs here", param="include")
    f.reject_unknown()
    req.pins = read_pins(headers or {})
    return req
