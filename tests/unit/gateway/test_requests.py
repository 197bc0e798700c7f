"""Validation of OpenAI bodies: every bad input is a 400 naming the field; good ones are carried."""

import orjson
import pytest

from services.common.errors import InvalidRequest
from services.gateway.core.openai_request import parse_chat, parse_completion
from services.gateway.core.to_proto import chat_to_preprocess, completion_to_preprocess

pytestmark = pytest.mark.unit

MSG = [{"role": "user", "content": "hi"}]


def chat(**kw):
    return orjson.dumps({"model": "m", "messages": MSG, **kw})


BAD_CHAT = [
    ("invalid json", b"{nope", None),
    ("not an object", b"[1,2]", None),
    ("empty body", b"", None),
    ("missing messages", orjson.dumps({"model": "m"}), "messages"),
    ("empty messages", chat(messages=[]), "messages"),
    ("message not object", chat(messages=["hi"]), "messages[0]"),
    ("bad role", chat(messages=[{"role": "robot", "content": "x"}]), "messages[0].role"),
    ("content wrong type", chat(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
    ("missing model", orjson.dumps({"messages": MSG}), "model"),
    ("blank model", chat(model="  "), "model"),
    ("model wrong type", chat(model=3), "model"),
    ("max_tokens zero", chat(max_tokens=0), "max_tokens"),
    ("max_tokens negative", chat(max_tokens=-5), "max_tokens"),
    ("max_completion_tokens zero", chat(max_completion_tokens=0), "max_completion_tokens"),
    ("max_tokens string", chat(max_tokens="10"), "max_tokens"),
    ("temperature high", chat(temperature=2.5), "temperature"),
    ("temperature negative", chat(temperature=-0.1), "temperature"),
    ("temperature string", chat(temperature="hot"), "temperature"),
    ("top_p high", chat(top_p=1.5), "top_p"),
    ("n zero", chat(n=0), "n"),
    ("n huge", chat(n=1000), "n"),
    ("n with greedy", chat(n=2, temperature=0), "n"),
    ("stream_options without stream", chat(stream_options={"include_usage": True}), "stream_options"),
    ("stop empty string", chat(stop=[""]), "stop"),
    ("stop wrong type", chat(stop=5), "stop"),
    ("too many stops", chat(stop=[str(i) for i in range(40)]), "stop"),
    ("top_logprobs without logprobs", chat(top_logprobs=2), "top_logprobs"),
    ("top_logprobs too many", chat(logprobs=True, top_logprobs=50), "top_logprobs"),
    ("unknown field", chat(frobnicate=1), "frobnicate"),
    ("logit_bias", chat(logit_bias={"5": 10}), "logit_bias"),
    ("functions deprecated", chat(functions=[]), "functions"),
    ("response_format bad schema", chat(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "nope"}}}), "response_format.json_schema.schema"),
    ("min_tokens above max", chat(min_tokens=10, max_tokens=5), "min_tokens"),
    ("top_k zero", chat(top_k=0), "top_k"),
    ("tool message without id", chat(messages=[{"role": "tool", "content": "x"}]), "messages[0].tool_call_id"),
    ("image part", chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
     "messages[0].content"),
    ("unknown stream_options key", chat(stream=True, stream_options={"x": 1}), "stream_options.x"),
    ("presence_penalty range", chat(presence_penalty=3), "presence_penalty"),
]


@pytest.mark.parametrize("name,body,param", BAD_CHAT, ids=[c[0] for c in BAD_CHAT])
def test_bad_chat_bodies_are_400_naming_the_field(name, body, param):
    with pytest.raises(InvalidRequest) as e:
        parse_chat(body)
    assert e.value.http_status == 400
    assert e.value.param == param
    assert e.value.message


def test_good_chat_carries_every_option_to_the_proto():
    req = parse_chat(chat(temperature=0.5, top_p=0.9, seed=42, stop=["END"], max_completion_tokens=12, max_tokens=99,
                          ignore_eos=True, min_tokens=2, top_k=5, logprobs=True, top_logprobs=3, stream=True,
                          stream_options={"include_usage": True}, chat_template_kwargs={"enable_thinking": False},
                          user="u", metadata={"a": "b"}))
    assert req.stream and req.include_usage
    p = chat_to_preprocess(req, "rid")
    r = p.request
    assert r.request_id == "rid" and r.model == "m"
    assert r.sampling.temperature == pytest.approx(0.5) and r.sampling.seed == 42 and r.sampling.top_k == 5
    assert r.stop.max_tokens == 12  # max_completion_tokens wins over max_tokens
    assert list(r.stop.stop) == ["END"] and r.stop.ignore_eos and r.stop.min_tokens == 2
    assert r.output.logprobs == 3
    assert orjson.loads(p.messages_json) == MSG
    assert orjson.loads(p.chat_template_kwargs_json) == {"enable_thinking": False}


def test_unset_sampling_stays_unset():
    r = chat_to_preprocess(parse_chat(chat()), "rid").request
    assert not r.sampling.HasField("temperature") and not r.stop.HasField("max_tokens")
    assert not r.output.HasField("logprobs")


def test_worker_pin_from_header_or_nvext():
    assert parse_chat(chat(), {"x-worker-instance-id": "w3"}).worker_id == "w3"
    assert parse_chat(chat(nvext={"backend_instance_id": "w4"})).worker_id == "w4"


BAD_COMPLETION = [
    ("missing prompt", orjson.dumps({"model": "m"}), "prompt"),
    ("empty prompt", orjson.dumps({"model": "m", "prompt": ""}), "prompt"),
    ("mixed prompt", orjson.dumps({"model": "m", "prompt": ["a", 1]}), "prompt"),
    ("logprobs too many", orjson.dumps({"model": "m", "prompt": "a", "logprobs": 9}), "logprobs"),
    ("suffix", orjson.dumps({"model": "m", "prompt": "a", "suffix": "z"}), "suffix"),
    ("best_of", orjson.dumps({"model": "m", "prompt": "a", "best_of": 3}), "best_of"),
    ("echo tokens", orjson.dumps({"model": "m", "prompt": [1, 2], "echo": True}), "echo"),
]


@pytest.mark.parametrize("name,body,param", BAD_COMPLETION, ids=[c[0] for c in BAD_COMPLETION])
def test_bad_completion_bodies(name, body, param):
    with pytest.raises(InvalidRequest) as e:
        parse_completion(body)
    assert e.value.param == param


def test_completion_prompt_forms_and_default_max_tokens():
    assert parse_completion(orjson.dumps({"model": "m", "prompt": "a"})).prompts == ["a"]
    assert parse_completion(orjson.dumps({"model": "m", "prompt": [1, 2]})).prompts == [[1, 2]]
    req = parse_completion(orjson.dumps({"model": "m", "prompt": [[1], [2, 3]], "n": 2, "temperature": 1}))
    assert req.prompts == [[1], [2, 3]] and req.n == 2
    assert req.sampling.max_tokens == 16
    p = completion_to_preprocess(req, [2, 3], "r")
    assert list(p.tokens.ids) == [2, 3] and p.request.stop.max_tokens == 16
