"""vLLM-style structured outputs (``structured_outputs``, ``guided_*``) reach the worker as GuidedDecoding."""

import orjson
import pytest

from services.common.errors import InvalidRequest
from services.gateway.core.openai_request import parse_chat, parse_completion
from services.gateway.core.to_proto import chat_to_preprocess, completion_to_preprocess

pytestmark = pytest.mark.unit

MSG = [{"role": "user", "content": "hi"}]


def guided_of_chat(**kw):
    req = parse_chat(orjson.dumps({"model": "m", "messages": MSG, **kw}))
    return chat_to_preprocess(req, "r").request.sampling.guided_decoding


@pytest.mark.parametrize(("body", "field", "value"), [
    ({"structured_outputs": {"regex": "[ab]+"}}, "regex", "[ab]+"),
    ({"structured_outputs": {"choice": ["yes", "no"]}}, "choice", ["yes", "no"]),
    ({"structured_outputs": {"grammar": 'root ::= "a"'}}, "grammar", 'root ::= "a"'),
    ({"structured_outputs": {"json_object": True}}, "json_object", True),
    ({"structured_outputs": {"json": {"type": "string"}}}, "json_schema", '{"type":"string"}'),
    ({"guided_json": '{"type": "string"}'}, "json_schema", '{"type":"string"}'),
    ({"guided_regex": "a+"}, "regex", "a+"),
    ({"guided_choice": ["x"]}, "choice", ["x"]),
    ({"guided_grammar": "root ::= x"}, "grammar", "root ::= x"),
])
def test_each_form_becomes_one_constraint(body, field, value):
    guided = guided_of_chat(**body)
    got = list(getattr(guided, field)) if field == "choice" else getattr(guided, field)
    assert got == value


def test_completions_carry_it_too():
    req = parse_completion(orjson.dumps({"model": "m", "prompt": "x", "guided_regex": "a+"}))
    assert completion_to_preprocess(req, "x", "r").request.sampling.guided_decoding.regex == "a+"


@pytest.mark.parametrize(("body", "param"), [
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs.regex"),
    ({"structured_outputs": {"regex": "a"}, "guided_regex": "b"}, "structured_outputs.regex"),
    ({"structured_outputs": {"regex": "a", "disable_any_whitespace": True}},
     "structured_outputs.disable_any_whitespace"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
    ({"structured_outputs": {"json_object": False}}, "structured_outputs.json_object"),
    ({"guided_json": "{nope"}, "guided_json"),
    ({"guided_json": {"type": 12}}, "guided_json"),
    ({"guided_regex": ""}, "guided_regex"),
    ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "structured_outputs"),
])
def test_bad_or_conflicting_constraints_are_400s_naming_the_field(body, param):
    with pytest.raises(InvalidRequest) as err:
        parse_chat(orjson.dumps({"model": "m", "messages": MSG, **body}))
    assert err.value.param == param
