"""Anthropic ``system``, ``messages`` and ``tools`` into the OpenAI chat shapes the preprocessor renders.

The mesh has one chat path: the preprocessor renders OpenAI-style messages with the model's chat
template. Anthropic's content blocks map onto it one to one:

- ``system`` (a string or text blocks) becomes a leading ``system`` message;
- user ``text`` blocks become a user message; each ``tool_result`` a ``tool`` message with
  ``tool_call_id`` = ``tool_use_id`` (an ``is_error`` result is prefixed ``Error: ``, so the model
  still learns the call failed), in the order the client sent them;
- assistant ``text`` blocks are joined into ``content``, ``tool_use`` blocks become ``tool_calls``
  (``input`` as JSON arguments), ``thinking`` blocks become ``reasoning_content``;
- ``tools`` become ``{"type": "function", "function": {name, description, parameters}}``.

Anything the mesh cannot honour (images, documents, server tools, redacted thinking, an assistant
prefill at the end) is a 400 naming the block, never dropped.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from services.common.errors import InvalidRequest
from services.gateway.core import tools as tools_checks

# Anthropic's tool name rule.
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_CACHE_TTLS = ("5m", "1h")


def _type_name(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(v), type(v).__name__)


def _check_keys(block: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(block) - allowed)
    if unknown:
        raise InvalidRequest(f"'{where}' has unsupported field(s): {', '.join(repr(k) for k in unknown)}",
                             param=f"{where}.{unknown[0]}")


def _string(block: dict[str, Any], key: str, where: str) -> str:
    v = block.get(key)
    if not isinstance(v, str):
        raise InvalidRequest(f"'{where}.{key}' must be a string, got {_type_name(v)}", param=f"{where}.{key}")
    return v


def check_cache_control(v: Any, param: str) -> None:
    """Prompt-caching breakpoints are accepted: the workers' prefix cache already reuses every shared prefix."""
    if v is None:
        return
    if not isinstance(v, dict) or v.get("type") != "ephemeral":
        raise InvalidRequest(f"'{param}' must be {{\"type\": \"ephemeral\"}}", param=param)
    _check_keys(v, {"type", "ttl"}, param)
    if "ttl" in v and v["ttl"] not in _CACHE_TTLS:
        raise InvalidRequest(f"'{param}.ttl' must be one of {', '.join(_CACHE_TTLS)}", param=f"{param}.ttl")


def _text_block(block: dict[str, Any], where: str) -> str:
    _check_keys(block, {"type", "text", "cache_control", "citations"}, where)
    check_cache_control(block.get("cache_control"), f"{where}.cache_control")
    if block.get("citations"):
        raise InvalidRequest(f"'{where}.citations' are not supported", param=f"{where}.citations")
    return _string(block, "text", where)


def _blocks(content: Any, where: str) -> list[tuple[dict[str, Any], str]]:
    """``content`` as (block, its path) pairs: a string is one text block."""
    if isinstance(content, str):
        return [({"type": "text", "text": content}, where)]
    if not isinstance(content, list):
        raise InvalidRequest(f"'{where}' must be a string or an array of content blocks, got {_type_name(content)}",
                             param=where)
    if not content:
        raise InvalidRequest(f"'{where}' must hold at least one content block", param=where)
    out = []
    for j, block in enumerate(content):
        path = f"{where}[{j}]"
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise InvalidRequest(f"'{path}' must be a content block object with a 'type'", param=path)
        out.append((block, path))
    return out


def system_text(system: Any) -> str | None:
    """``system`` as one string (text blocks joined by newlines), or None when absent."""
    if system is None:
        return None
    texts = []
    for block, path in _blocks(system, "system"):
        if block["type"] != "text":
            raise InvalidRequest(f"'{path}' must be a text block; got {block['type']!r}", param=path)
        texts.append(_text_block(block, path))
    return "\n".join(texts)


def _tool_result(block: dict[str, Any], where: str, tool_use_ids: set[str]) -> dict[str, Any]:
    _check_keys(block, {"type", "tool_use_id", "content", "is_error", "cache_control"}, where)
    check_cache_control(block.get("cache_control"), f"{where}.cache_control")
    tool_use_id = _string(block, "tool_use_id", where)
    if tool_use_id not in tool_use_ids:
        # Anthropic's rule: a result answers a tool_use of the assistant message right before it. A result
        # for no call would reach the template as a tool message answering nothing.
        raise InvalidRequest(f"'{where}.tool_use_id' matches no tool_use block in the previous (assistant) "
                             "message; each tool_result must answer one of its calls", param=f"{where}.tool_use_id")
    content = block.get("content") or ""  # absent, null or [] : a result with no output
    texts = []
    for part, path in _blocks(content, f"{where}.content"):
        if part["type"] != "text":
            raise InvalidRequest(f"'{path}': only text tool results are supported; got {part['type']!r}", param=path)
        texts.append(_text_block(part, path))
    text = "\n".join(texts)
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool):
        raise InvalidRequest(f"'{where}.is_error' must be a boolean", param=f"{where}.is_error")
    return {"role": "tool", "tool_call_id": tool_use_id, "content": f"Error: {text}" if is_error else text}


def _user(content: Any, where: str, tool_use_ids: set[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    texts: list[dict[str, str]] = []

    def flush() -> None:
        if texts:
            out.append({"role": "user", "content": list(texts)})
            texts.clear()

    for block, path in _blocks(content, where):
        kind = block["type"]
        if kind == "text":
            texts.append({"type": "text", "text": _text_block(block, path)})
        elif kind == "tool_result":
            flush()
            out.append(_tool_result(block, path, tool_use_ids))
        else:
            raise InvalidRequest(f"'{path}': {kind!r} blocks are not supported in user messages "
                                 "(text and tool_result are)", param=path)
    flush()
    return out


def _assistant(content: Any, where: str) -> dict[str, Any]:
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for block, path in _blocks(content, where):
        kind = block["type"]
        if kind == "text":
            texts.append(_text_block(block, path))
        elif kind == "thinking":
            _check_keys(block, {"type", "thinking", "signature"}, path)
            reasoning.append(_string(block, "thinking", path))
        elif kind == "tool_use":
            _check_keys(block, {"type", "id", "name", "input", "cache_control"}, path)
            check_cache_control(block.get("cache_control"), f"{path}.cache_control")
            args = block.get("input")
            if not isinstance(args, dict):
                raise InvalidRequest(f"'{path}.input' must be an object", param=f"{path}.input")
            calls.append({"id": _string(block, "id", path), "type": "function",
                          "function": {"name": _string(block, "name", path),
                                       "arguments": orjson.dumps(args).decode()}})
        else:
            raise InvalidRequest(f"'{path}': {kind!r} blocks are not supported in assistant messages "
                                 "(text, thinking and tool_use are)", param=path)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    return message


def to_chat_messages(system: Any, messages: list[Any] | None) -> list[dict[str, Any]]:
    """The OpenAI chat messages for Anthropic's ``system`` and ``messages``."""
    if not messages:
        raise InvalidRequest("'messages' must be a non-empty array", param="messages")
    out: list[dict[str, Any]] = []
    text = system_text(system)
    if text:
        out.append({"role": "system", "content": text})
    tool_use_ids: set[str] = set()  # the ids of the previous message's tool_use blocks
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise InvalidRequest(f"'{where}' must be an object, got {_type_name(m)}", param=where)
        _check_keys(m, {"role", "content"}, where)
        role = m.get("role")
        if "content" not in m:
            raise InvalidRequest(f"'{where}.content' is required", param=f"{where}.content")
        if role == "user":
            out.extend(_user(m["content"], f"{where}.content", tool_use_ids))
            tool_use_ids = set()
        elif role == "assistant":
            message = _assistant(m["content"], f"{where}.content")
            tool_use_ids = {call["id"] for call in message.get("tool_calls", ())}
            out.append(message)
        else:
            raise InvalidRequest(f"'{where}.role' must be 'user' or 'assistant' (the system prompt is the "
                                 f"top-level 'system'); got {role!r}", param=f"{where}.role")
    if messages[-1].get("role") == "assistant":
        # The chat template always opens a new assistant turn; continuing a partial one is not supported.
        where = f"messages[{len(messages) - 1}]"
        raise InvalidRequest(f"'{where}': a final assistant message (prefill) is not supported; "
                             "end with a user message", param=where)
    return out


def to_chat_tools(tools: list[Any] | None) -> list[dict[str, Any]] | None:
    """Anthropic custom tools as OpenAI function tools; server tools are refused."""
    if tools is None:
        return None
    out = []
    names: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise InvalidRequest(f"'{where}' must be an object, got {_type_name(tool)}", param=where)
        if tool.get("type", "custom") != "custom":
            raise InvalidRequest(f"'{where}.type': only custom tools are supported; got {tool.get('type')!r}",
                                 param=f"{where}.type")
        _check_keys(tool, {"type", "name", "description", "input_schema", "cache_control", "strict"}, where)
        check_cache_control(tool.get("cache_control"), f"{where}.cache_control")
        name = tool.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.match(name):
            raise InvalidRequest(f"'{where}.name' must be 1-128 letters, digits, '_' or '-'", param=f"{where}.name")
        if name in names:
            raise InvalidRequest(f"'{where}.name' {name!r} is defined twice", param=f"{where}.name")
        names.add(name)
        schema = tool.get("input_schema")
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise InvalidRequest(f"'{where}.input_schema' must be a JSON Schema object with \"type\": \"object\"",
                                 param=f"{where}.input_schema")
        tools_checks.check_schema(schema, f"{where}.input_schema")
        fn: dict[str, Any] = {"name": name, "parameters": schema}
        if "description" in tool:
            fn["description"] = _string(tool, "description", where)
        if "strict" in tool:
            if not isinstance(tool["strict"], bool):
                raise InvalidRequest(f"'{where}.strict' must be a boolean", param=f"{where}.strict")
            fn["strict"] = tool["strict"]
        out.append({"type": "function", "function": fn})
    return out


def to_chat_tool_choice(choice: Any, tools: list[dict[str, Any]] | None) -> tuple[Any, bool]:
    """(OpenAI ``tool_choice``, ``parallel_tool_calls``) for Anthropic's ``tool_choice``.

    ``auto`` → ``auto``, ``any`` → ``required``, ``tool`` → the named function, ``none`` → ``none``;
    ``disable_parallel_tool_use`` → ``parallel_tool_calls: false``.
    """
    if choice is None:
        return None, True
    if not isinstance(choice, dict):
        raise InvalidRequest(f"'tool_choice' must be an object, got {_type_name(choice)}", param="tool_choice")
    kind = choice.get("type")
    allowed = {"auto": {"type", "disable_parallel_tool_use"}, "any": {"type", "disable_parallel_tool_use"},
               "tool": {"type", "name", "disable_parallel_tool_use"}, "none": {"type"}}
    if not isinstance(kind, str) or kind not in allowed:
        raise InvalidRequest(f"'tool_choice.type' must be one of auto, any, tool, none; got {kind!r}",
                             param="tool_choice.type")
    _check_keys(choice, allowed[kind], "tool_choice")
    disable = choice.get("disable_parallel_tool_use", False)
    if not isinstance(disable, bool):
        raise InvalidRequest("'tool_choice.disable_parallel_tool_use' must be a boolean",
                             param="tool_choice.disable_parallel_tool_use")
    if kind in ("any", "tool") and not tools:
        raise InvalidRequest(f"'tool_choice' {kind!r} needs 'tools'", param="tool_choice")
    if kind == "tool":
        name = _string(choice, "name", "tool_choice")
        if not any(t["function"]["name"] == name for t in tools or ()):
            raise InvalidRequest(f"'tool_choice.name' {name!r} is not in 'tools'", param="tool_choice.name")
        return {"type": "function", "function": {"name": name}}, not disable
    if not tools:
        return None, True  # auto or none without tools: nothing to choose from
    return ("required" if kind == "any" else kind), not disable
