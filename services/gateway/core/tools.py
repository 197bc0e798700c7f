"""Validation of ``tools``, ``tool_choice`` and ``response_format``, and the guided decoding they imply.

Everything is checked before any work starts, so a bad schema or an unknown function name is a 400
naming the field. ``guided_decoding`` turns the validated request into the worker's constraint:

- ``tool_choice`` named → the function's parameters schema (the output *is* the arguments);
- ``tool_choice: "required"`` → an array of ``{"name", "parameters"}`` objects, one item at most
  when ``parallel_tool_calls`` is false;
- ``response_format`` ``json_schema`` → that schema; ``json_object`` → any JSON object.

A forced tool choice wins over ``response_format`` (the reply is a tool call then, as in vLLM).
"""

from __future__ import annotations

import re
from typing import Any

import orjson
from meshfront.common.v1 import common_pb2

from services.common.errors import InvalidRequest

_FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_TOOL_CHOICES = ("none", "auto", "required")


def check_schema(schema: Any, param: str) -> None:
    if not isinstance(schema, dict):
        raise InvalidRequest(f"'{param}' must be a JSON Schema object", param=param)
    from jsonschema import Draft202012Validator  # imported on first use: only schema-bearing requests pay
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "(root)"
        raise InvalidRequest(f"'{param}' is not a valid JSON Schema at {where}: {e.message}", param=param) from None


def check_tools(tools: list[Any] | None) -> list[dict[str, Any]] | None:
    """Each tool is ``{"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}}``."""
    if not tools:
        return tools
    names = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise InvalidRequest(f"'{where}' must be {{\"type\": \"function\", \"function\": {{...}}}}", param=where)
        fn = tool["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not _FUNCTION_NAME.match(name):
            raise InvalidRequest(f"'{where}.function.name' must be 1-64 letters, digits, '_', '.' or '-'",
                                 param=f"{where}.function.name")
        if name in names:
            raise InvalidRequest(f"'{where}.function.name' {name!r} is defined twice", param=f"{where}.function.name")
        names.add(name)
        unknown = set(fn) - {"name", "description", "parameters", "strict"}
        if unknown:
            raise InvalidRequest(f"'{where}.function' has unknown fields: {', '.join(sorted(unknown))}",
                                 param=f"{where}.function")
        if fn.get("parameters") is not None:
            check_schema(fn["parameters"], f"{where}.function.parameters")
    return tools


def check_tool_choice(choice: Any, tools: list[dict[str, Any]] | None) -> Any:
    """``none`` | ``auto`` | ``required`` | ``{"type": "function", "function": {"name": ...}}``."""
    if choice is None:
        return None
    if isinstance(choice, str):
        if choice not in _TOOL_CHOICES:
            raise InvalidRequest(f"'tool_choice' must be one of {', '.join(_TOOL_CHOICES)} or a named function; "
                                 f"got {choice!r}", param="tool_choice")
        if choice == "required" and not tools:
            raise InvalidRequest("'tool_choice' 'required' needs 'tools'", param="tool_choice")
        return choice
    fn = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise InvalidRequest(
            "'tool_choice' must be a string or {\"type\": \"function\", \"function\": {\"name\": ...}}",
            param="tool_choice")
    if not any(t["function"]["name"] == name for t in tools or ()):
        raise InvalidRequest(f"'tool_choice' names function {name!r}, which is not in 'tools'", param="tool_choice")
    return choice


_MODES = {"auto": common_pb2.TOOL_CHOICE_MODE_AUTO, "none": common_pb2.TOOL_CHOICE_MODE_NONE,
          "required": common_pb2.TOOL_CHOICE_MODE_REQUIRED}


def tool_choice_proto(choice: Any) -> common_pb2.ToolChoice:
    """A ``tool_choice`` that ``check_tool_choice`` accepted, as the mesh carries it."""
    if isinstance(choice, str):
        return common_pb2.ToolChoice(mode=_MODES[choice])
    return common_pb2.ToolChoice(mode=common_pb2.TOOL_CHOICE_MODE_NAMED, function_name=choice["function"]["name"])


def check_response_format(fmt: dict[str, Any] | None) -> dict[str, Any] | None:
    """None for text; ``{"type": "json_object"}``; ``{"type": "json_schema", "schema": ...}`` (validated)."""
    if fmt is None:
        return None
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        raise InvalidRequest(f"'response_format.type' must be text, json_object or json_schema; got {kind!r}",
                             param="response_format.type")
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise InvalidRequest("'response_format.json_schema' must be an object with a 'name'",
                             param="response_format.json_schema")
    schema = spec.get("schema", {})
    check_schema(schema, "response_format.json_schema.schema")
    return {"type": "json_schema", "schema": schema}


def guided_decoding(tools: list[dict[str, Any]] | None, tool_choice: Any, parallel_tool_calls: bool,
                    response_format: dict[str, Any] | None) -> dict[str, Any] | None:
    """The constraint for the worker as ``{"json_schema": str}`` or ``{"json_object": True}``, or None."""
    if isinstance(tool_choice, dict):
        name = tool_choice["function"]["name"]
        fn = next(t["function"] for t in tools or () if t["function"]["name"] == name)
        return {"json_schema": orjson.dumps(fn.get("parameters") or {"type": "object"}).decode()}
    if tool_choice == "required":
        items = [{"type": "object", "required": ["name", "parameters"],
                  "properties": {"name": {"type": "string", "enum": [t["function"]["name"]]},
                                 "parameters": t["function"].get("parameters") or {"type": "object"}}}
                 for t in tools or ()]
        schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": items}}
        if not parallel_tool_calls:
            schema["maxItems"] = 1
        return {"json_schema": orjson.dumps(schema).decode()}
    if response_format is None:
        return None
    if response_format["type"] == "json_object":
        return {"json_object": True}
    return {"json_schema": orjson.dumps(response_format["schema"]).decode()}
