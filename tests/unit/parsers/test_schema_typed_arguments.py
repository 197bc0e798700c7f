"""Raw-text argument values (Qwen3-Coder, GLM, MiniMax M2) get their JSON types from the request's tools.

The goldens check the formats; these check the path the postprocessor takes (``ParseContext.tools_json``
reaches the parser) and the schema shapes that decide a parameter's type.
"""

from __future__ import annotations

import orjson
import pytest

from services.postprocessor.core.parsers import ParserConfig
from services.postprocessor.core.parsers.backends import OursChatProcessor, ParseContext
from services.postprocessor.core.parsers.tool_calls.param_types import ToolSchemas, to_json
from tests.unit.parsers.cases import fold

pytestmark = pytest.mark.unit


def _tools(properties: dict) -> str:
    return orjson.dumps([{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": properties}}}]).decode()


def test_the_postprocessors_parse_context_gives_the_parser_the_tools_schemas():
    text = ("<tool_call>\n<function=f>\n<parameter=n>\n3\n</parameter>\n<parameter=s>\n3\n</parameter>\n"
            "</function>\n</tool_call>")
    context = ParseContext(tools_json=_tools({"n": {"type": "integer"}, "s": {"type": "string"}}))
    parser = OursChatProcessor().output_parser(ParserConfig("qwen3_coder", has_tools=True), context)
    assert parser is not None
    result = fold([parser.feed(text), parser.finish()])
    assert [(name, orjson.loads(args)) for name, args in result.calls] == [("f", {"n": 3, "s": "3"})]
    assert parser.ends_with_tool_calls


@pytest.mark.parametrize(("schema", "raw", "expected"), [
    ({"type": ["integer", "null"]}, "5", 5),
    ({"type": ["integer", "null"]}, "null", None),
    ({"anyOf": [{"type": "number"}, {"type": "null"}]}, "2.5", 2.5),
    ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, "7", 7),  # a mixed union: JSON if it is JSON
    ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, "seven", "seven"),
    ({"enum": ["a", "b"]}, "a", "a"),
    ({"enum": [1, 2]}, "2", 2),
    ({"type": "array", "items": {"type": "integer"}}, "(1, 2)", [1, 2]),  # a Python literal
    ({"type": "object"}, "{'k': None}", {"k": None}),
    ({"type": "object"}, "{broken", "{broken"),
    ({"type": "number"}, "inf", "inf"),  # not a JSON number: kept as the model wrote it
    ({"type": "integer"}, "4.0", "4.0"),
    ({"type": "boolean"}, "FALSE", False),
    ({"type": "string"}, "None", "None"),
    ({}, "12", "12"),  # no type: a string
])
def test_a_parameters_schema_decides_its_json_type(schema, raw, expected):
    schemas = ToolSchemas.from_json(_tools({"p": schema}))
    assert orjson.loads(to_json(raw, schemas.kind("f", "p"))) == expected


def test_unknown_functions_and_parameters_are_strings():
    schemas = ToolSchemas.from_json(_tools({"p": {"type": "integer"}}))
    assert schemas.kind("f", "q") == schemas.kind("g", "p") == ToolSchemas.from_json("").kind("f", "p") == "string"
