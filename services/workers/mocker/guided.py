"""Guided decoding for the mocker: an answer that satisfies the request's JSON Schema.

A real engine constrains sampling with a grammar; the mocker has no sampling, so it writes one
deterministic instance of the schema (every property present, the first of each enum / anyOf /
oneOf, arrays at their minimum length but at least one item, numbers at their minimum). Enough to
carry structured output and forced tool calls through the whole mesh in tests.

A structural tag (docs/parsers.md, "Structural tags") that forces calls is written out the same way: its
first call, in the model's markup, with an instance of the arguments' schema. A tag that leaves the model free
to write text (``triggered_tags``, tool_choice auto) is not enforced: the script answers.
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


def structural_text(tag_json: str) -> str | None:
    """The mocker's answer for a structural tag, or None when the tag lets the model write anything first."""
    return _format_text(json.loads(tag_json)["format"])


def _format_text(fmt: dict[str, Any]) -> str | None:  # noqa: PLR0911 - one return per kind of format
    kind = fmt["type"]
    if kind == "const_string":
        return str(fmt["value"])
    if kind == "any_text":  # the rest of an open reasoning block: none
        return ""
    if kind == "regex":  # Kimi's call index is the only regex our tags hold
        return ":0" if fmt["pattern"] == r":\d+" else None
    if kind == "json_schema":
        return _arguments(fmt["json_schema"], fmt.get("style", "json"))
    if kind == "tag":
        content = _format_text(fmt["content"])
        end = fmt["end"] if isinstance(fmt["end"], str) else fmt["end"][0]
        return None if content is None else fmt["begin"] + content + end
    if kind == "tags_with_separator":
        return _format_text(fmt["tags"][0])
    if kind == "sequence":
        parts = [_format_text(e) for e in fmt["elements"]]
        return None if any(p is None for p in parts) else "".join(p for p in parts if p is not None)
    return None  # triggered_tags and the rest: free text first, as the script writes it


def _arguments(schema: Any, style: str) -> str:
    value = instance(schema if isinstance(schema, dict) else {"type": "object"}, "arg")
    if style == "json" or not isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    def text(v: Any) -> str:
        return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
    if style == "qwen_xml":
        return "\n".join(f"<parameter={k}>\n{text(v)}\n</parameter>" for k, v in value.items())
    return "".join(f'<parameter name="{k}">{text(v)}</parameter>\n' for k, v in value.items())  # minimax_xml
