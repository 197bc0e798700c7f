"""Guided decoding for the mocker: an answer that satisfies the request's JSON Schema.

A real engine constrains sampling with a grammar; the mocker has no sampling, so it writes one
deterministic instance of the schema (every property present, the first of each enum / anyOf /
oneOf, arrays at their minimum length but at least one item, numbers at their minimum). Enough to
carry structured output and forced tool calls through the whole mesh in tests.
"""

from __future__ import annotations

import json
from typing import Any

_MAX_DEPTH = 16


def instance(schema: Any, name: str = "value", depth: int = 0) -> Any:
    """A value valid for ``schema`` (a JSON Schema as a dict); ``name`` seeds string values."""
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return None if depth > _MAX_DEPTH else {}
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return instance(schema[key][0], name, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    return _BUILDERS.get(kind, _null)(schema, name, depth)


def _object(schema: dict, name: str, depth: int) -> dict:
    props = schema.get("properties") or {}
    return {key: instance(sub, key, depth + 1) for key, sub in props.items()}


def _array(schema: dict, name: str, depth: int) -> list:
    count = max(int(schema.get("minItems", 1)), 1)
    if "maxItems" in schema:
        count = min(count, int(schema["maxItems"]))
    items = schema.get("items", {})
    return [instance(items, name, depth + 1) for _ in range(count)]


def _string(schema: dict, name: str, depth: int) -> str:
    text = f"{name} value"
    lo, hi = int(schema.get("minLength", 0)), schema.get("maxLength")
    if len(text) < lo:
        text += "x" * (lo - len(text))
    return text[:int(hi)] if hi is not None else text


def _number(schema: dict, name: str, depth: int) -> float:
    fallback = schema["exclusiveMinimum"] + 0.5 if "exclusiveMinimum" in schema else 1.5
    return float(schema.get("minimum", fallback))


def _integer(schema: dict, name: str, depth: int) -> int:
    if "minimum" in schema:
        return int(schema["minimum"])
    if "exclusiveMinimum" in schema:
        return int(schema["exclusiveMinimum"]) + 1
    return min(1, int(schema.get("maximum", 1)))


def _null(schema: dict, name: str, depth: int) -> None:
    return None


_BUILDERS = {"object": _object, "array": _array, "string": _string, "number": _number, "integer": _integer,
             "boolean": lambda s, n, d: True, "null": _null}


def guided_text(json_schema: str) -> str:
    """The mocker's answer for a guided request: ``json_schema`` is the schema as JSON text."""
    schema = json.loads(json_schema) if json_schema else {"type": "object"}
    return json.dumps(instance(schema), ensure_ascii=False)
