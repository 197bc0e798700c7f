"""JSON types of tool parameters, for formats whose parameter values are raw text.

Qwen3-Coder, GLM-4.5/4.7 and MiniMax M2 write each argument as the bare text between two tags
(``<parameter=count>3</parameter>``), so the text alone cannot tell the string ``"3"`` from the
number 3. The request's ``tools`` can: a parameter's JSON Schema type decides how its text becomes
JSON. Rules (the same for every such format):

- a parameter the schema does not describe (or a request without that tool) stays a string;
- ``string`` keeps the text as it is (even ``null``);
- ``integer`` / ``number`` / ``boolean`` convert when the text is one (``True``/``FALSE`` too), and
  otherwise stay strings, so nothing the model wrote is lost;
- ``null`` / ``None`` is JSON null for any non-string type;
- anything else (``object``, ``array``, unions) is the text itself when it is valid JSON, else a
  Python literal (models trained on ``str(dict)`` templates write ``{'a': 1}``), else a string.
"""

from __future__ import annotations

import ast
import math

import orjson

STRING, INTEGER, NUMBER, BOOLEAN, JSON = "string", "integer", "number", "boolean", "json"
_KINDS = {"string": STRING, "integer": INTEGER, "number": NUMBER, "boolean": BOOLEAN}


class ToolSchemas:
    """Parameter kinds of the request's tools, looked up by function and parameter name."""

    def __init__(self, properties: dict[str, dict]):
        self._properties = properties

    @classmethod
    def from_json(cls, tools_json: str) -> ToolSchemas:
        """From the request's ``tools`` (OpenAI JSON; validated by the gateway, "" for none)."""
        if not tools_json:
            return cls({})
        tools = orjson.loads(tools_json)
        properties: dict[str, dict] = {}
        for tool in tools if isinstance(tools, list) else ():
            function = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                continue
            parameters = function.get("parameters")
            props = parameters.get("properties") if isinstance(parameters, dict) else None
            properties[function["name"]] = props if isinstance(props, dict) else {}
        return cls(properties)

    def kind(self, function: str, parameter: str) -> str:
        schema = self._properties.get(function, {}).get(parameter)
        return _kind_of(schema) if isinstance(schema, dict) else STRING

    def schema(self, function: str, parameter: str) -> dict | None:
        """A parameter's own JSON Schema (formats that nest values in markup walk it), None when undescribed."""
        schema = self._properties.get(function, {}).get(parameter)
        return schema if isinstance(schema, dict) else None


def kind_of(schema: dict | None) -> str:
    """The kind (``STRING``, ``JSON``, …) of a value described by ``schema`` (None: a string)."""
    return _kind_of(schema) if schema is not None else STRING


def _kind_of(schema: dict) -> str:
    declared = schema.get("type")
    if isinstance(declared, list):  # ["integer", "null"]: the first non-null type
        declared = next((t for t in declared if t != "null"), "null")
    if isinstance(declared, str):
        return _KINDS.get(declared, JSON)
    for union in ("anyOf", "oneOf"):
        options = schema.get(union)
        if isinstance(options, list):
            kinds = [_kind_of(o) for o in options if isinstance(o, dict) and o.get("type") != "null"]
            return kinds[0] if len(set(kinds)) == 1 else JSON
    if isinstance(schema.get("enum"), list) and all(isinstance(v, str) for v in schema["enum"]):
        return STRING
    return JSON if ("properties" in schema or "items" in schema or "enum" in schema) else STRING


def _string(text: str) -> str:
    return orjson.dumps(text).decode()


def to_json(raw: str, kind: str) -> str:  # noqa: PLR0911 - one return per conversion rule
    """The JSON text of one parameter whose raw value is ``raw`` (see the module's rules)."""
    if kind == STRING:
        return _string(raw)
    text = raw.strip()
    if text.lower() in ("null", "none"):
        return "null"
    if kind == BOOLEAN:
        return text.lower() if text.lower() in ("true", "false") else _string(raw)
    if kind in (INTEGER, NUMBER):
        try:
            return str(int(text))
        except ValueError:
            pass
        try:
            number = float(text)
        except ValueError:
            return _string(raw)
        return orjson.dumps(number).decode() if kind == NUMBER and math.isfinite(number) else _string(raw)
    try:
        orjson.loads(text)
        return text
    except orjson.JSONDecodeError:
        pass
    try:
        return orjson.dumps(ast.literal_eval(text)).decode()
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError, orjson.JSONEncodeError):
        return _string(raw)
