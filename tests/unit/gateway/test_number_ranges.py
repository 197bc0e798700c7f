"""Every number a client sends is checked against the proto field it lands in (issue 12, item 5).

A value protobuf cannot hold used to reach ``to_proto`` and surface as a 500 ("Value out of
range"); each one is now an InvalidRequest (400) naming the parameter. The bodies are written as
JSON text, so literals beyond 64 bits reach the parser exactly as a client sends them.
"""

from __future__ import annotations

import math

import orjson
import pytest

from services.common.errors import InvalidRequest
from services.gateway.core.fields import FLOAT32_MAX, UINT32, check_float, check_int, token_ids
from services.gateway.core.openai_request import parse_chat, parse_completion
from services.gateway.core.to_proto import chat_to_preprocess, completion_to_preprocess

pytestmark = pytest.mark.unit

MSG = [{"role": "user", "content": "hi"}]
I32, U32, I64, U64 = 2**31, 2**32, 2**63, 2**64


def body(endpoint: str, literal_fields: dict[str, str], **fields) -> bytes:
    """A request body with ``literal_fields`` spliced in as raw JSON text."""
    base = {"model": "m", **({"messages": MSG} if endpoint == "chat" else {"prompt": "hi"}), **fields}
    raw = orjson.dumps(base)[:-1]
    for key, literal in literal_fields.items():
        raw += b',"' + key.encode() + b'":' + literal.encode()
    return raw + b"}"


def build(endpoint: str, raw: bytes):
    """Parses and builds every proto the gateway would send, as the servers do."""
    if endpoint == "chat":
        return [chat_to_preprocess(parse_chat(raw), "r")]
    req = parse_completion(raw)
    return [completion_to_preprocess(req, p, "r") for p in req.prompts]


def rejects(endpoint: str, raw: bytes) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as e:
        build(endpoint, raw)
    assert e.value.http_status == 400 and e.value.message
    assert "Value out of range" not in e.value.message and "ValueError" not in e.value.message
    return e.value


# --- the issue's three examples ------------------------------------------------------------------


def test_issue_example_max_tokens_beyond_uint32():
    e = rejects("chat", body("chat", {"max_tokens": "99999999999"}))
    assert e.param == "max_tokens" and "4294967295" in e.message


def test_issue_example_top_k_beyond_int32():
    e = rejects("chat", body("chat", {"top_k": "1099511627776"}))
    assert e.param == "top_k" and "2147483647" in e.message


@pytest.mark.parametrize("prompt", ["[99999999999, 1]", "[-1, 1]"])
def test_issue_example_token_id_prompts(prompt):
    e = rejects("completions", body("completions", {"prompt": prompt}))
    assert e.param == "prompt" and "prompt[0]" in e.message


# --- every integer field -------------------------------------------------------------------------

# (endpoint, field, lowest accepted, highest accepted, other fields the value needs to be checked)
INT_FIELDS = [
    ("chat", "max_tokens", 1, U32 - 1, {}),
    ("chat", "max_completion_tokens", 1, U32 - 1, {}),
    ("chat", "min_tokens", 0, U32 - 1, {}),
    ("chat", "top_k", -1, I32 - 1, {}),
    ("chat", "seed", -I64, U64 - 1, {}),
    ("chat", "n", 1, 128, {"temperature": 1}),
    ("chat", "top_logprobs", 0, 20, {"logprobs": True}),
    ("completions", "max_tokens", 1, U32 - 1, {}),
    ("completions", "min_tokens", 0, U32 - 1, {"max_tokens": U32 - 1}),
    ("completions", "top_k", -1, I32 - 1, {}),
    ("completions", "seed", -I64, U64 - 1, {}),
    ("completions", "n", 1, 128, {"temperature": 1}),
    ("completions", "logprobs", 0, 5, {}),
    ("completions", "best_of", 1, 1, {}),
]
# Never integers: booleans (Python's bool is an int), fractions, strings, containers, and the
# integer literals past every proto integer type (orjson reads those as floats).
NOT_INTEGERS = ["true", "false", "2.5", "-0.5", '"7"', "[1]", '{"a": 1}', "1e-300"]
BEYOND_ANY_TYPE = ["18446744073709551616", "99999999999999999999999", "-9223372036854775809",
                   "-99999999999999999999999", "1e300", "-1e300", "1.8446744073709552e19"]


def _ids(cases):
    return [f"{c[0]}-{c[1]}" for c in cases]


@pytest.mark.parametrize("endpoint,field,lo,hi,ctx", INT_FIELDS, ids=_ids(INT_FIELDS))
def test_integer_fields_refuse_out_of_range_and_non_integers(endpoint, field, lo, hi, ctx):
    for literal in [str(lo - 1), str(hi + 1), *NOT_INTEGERS, *BEYOND_ANY_TYPE]:
        e = rejects(endpoint, body(endpoint, {field: literal}, **ctx))
        assert e.param == field, (literal, e.message)
    for literal in ("true", "2.5"):
        assert "must be an integer" in rejects(endpoint, body(endpoint, {field: literal}, **ctx)).message


@pytest.mark.parametrize("endpoint,field,lo,hi,ctx", INT_FIELDS, ids=_ids(INT_FIELDS))
def test_integer_fields_carry_their_extremes_into_the_proto(endpoint, field, lo, hi, ctx):
    for value in (lo, hi):
        if field == "top_k" and value == lo:
            value = -1
        build(endpoint, body(endpoint, {field: str(value)}, **ctx))
    build(endpoint, body(endpoint, {field: f"{float(max(lo, 1))}"}, **ctx))  # an integral float is that integer


def test_the_seed_wraps_negatives_and_keeps_uint64():
    assert chat_to_preprocess(parse_chat(body("chat", {"seed": "-1"})), "r").request.sampling.seed == U64 - 1
    assert chat_to_preprocess(parse_chat(body("chat", {"seed": str(U64 - 1)})), "r").request.sampling.seed == U64 - 1


# --- every float field ---------------------------------------------------------------------------

FLOAT_FIELDS = [("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0), ("min_p", 0.0, 1.0),
                ("frequency_penalty", -2.0, 2.0), ("presence_penalty", -2.0, 2.0), ("repetition_penalty", 0.0, 2.0)]


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("field,lo,hi", FLOAT_FIELDS, ids=[f[0] for f in FLOAT_FIELDS])
def test_float_fields(endpoint, field, lo, hi):
    for literal in ["true", "false", '"0.5"', "[0.5]", "{}", str(hi + 0.5), str(lo - 0.5), "1e39", "-1e39",
                    "1e300", "99999999999999999999999", str(U64 - 1), str(-I64)]:
        e = rejects(endpoint, body(endpoint, {field: literal}))
        assert e.param == field, (literal, e.message)
    for value in (hi, 1):
        build(endpoint, body(endpoint, {field: str(value)}))


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"])
def test_nan_and_infinity_are_not_json(literal):
    e = rejects("chat", body("chat", {"temperature": literal}))
    assert "not valid JSON" in e.message


def test_float_checks_hold_without_json():
    """What orjson cannot produce, another caller (KServe's doubles) could: the check refuses it too."""
    for v in (math.nan, math.inf, -math.inf):
        with pytest.raises(InvalidRequest, match="finite"):
            check_float(v, "temperature", 0.0, 2.0)
    with pytest.raises(InvalidRequest):
        check_float(FLOAT32_MAX * 2, "x")
    assert check_float(FLOAT32_MAX, "x") == FLOAT32_MAX
    with pytest.raises(InvalidRequest, match="must be an integer"):
        check_int(math.nan, "x", UINT32)


# --- booleans and nested objects: numbers where they do not belong -----------------------------

BOOL_FIELDS = [
    ("chat", "stream", {}), ("chat", "ignore_eos", {}), ("chat", "include_stop_str_in_output", {}),
    ("chat", "skip_special_tokens", {}), ("chat", "logprobs", {}), ("chat", "parallel_tool_calls", {}),
    ("completions", "echo", {}), ("completions", "stream", {}),
]


@pytest.mark.parametrize("endpoint,field,ctx", BOOL_FIELDS, ids=[f"{c[0]}-{c[1]}" for c in BOOL_FIELDS])
def test_numbers_are_not_booleans(endpoint, field, ctx):
    for literal in ["0", "1", "1.0", "99999999999999999999999"]:
        assert rejects(endpoint, body(endpoint, {field: literal}, **ctx)).param == field


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("key,param,ctx", [
    ("stream_options", "stream_options.include_usage", {"stream": True}),
    ("nvext", "nvext.backend_instance_id", {}),
    ("structured_outputs", "structured_outputs.json_object", {}),
])
def test_numbers_in_nested_objects(endpoint, key, param, ctx):
    inner = param.split(".", 1)[1]
    bad = ["1.5", "-1", "18446744073709551616", "99999999999999999999999"]
    bad += ["true", "false"] if inner == "backend_instance_id" else ["0", "1"]
    for literal in bad:
        raw = body(endpoint, {key: f'{{"{inner}": {literal}}}'}, **ctx)
        assert rejects(endpoint, raw).param == param, literal


def test_a_numeric_worker_pin_is_its_id():
    assert parse_chat(body("chat", {"nvext": '{"backend_instance_id": 7}'})).worker_id == "7"
    assert parse_chat(body("chat", {"nvext": f'{{"backend_instance_id": {U64 - 1}}}'})).worker_id == str(U64 - 1)


# --- token-id prompts ----------------------------------------------------------------------------

BAD_PROMPTS = ["[4294967296]", "[99999999999999999999999]", "[1, -1]", "[1.5]", "[true, 1]", "[1, null]",
               "[[1], [2, -1]]", "[[1], []]", "[[1], [4294967296]]", "[[true]]", "[1e300]"]


@pytest.mark.parametrize("prompt", BAD_PROMPTS)
def test_bad_token_id_prompts(prompt):
    assert rejects("completions", body("completions", {"prompt": prompt})).param == "prompt"


def test_token_ids_at_the_uint32_edges_reach_the_proto():
    """Whether an id is in the vocabulary is the preprocessor's 400; the gateway checks the type."""
    protos = build("completions", body("completions", {"prompt": f"[[0, {U32 - 1}], [5]]"}))
    assert [list(p.tokens.ids) for p in protos] == [[0, U32 - 1], [5]]


def test_token_ids_is_one_check_naming_the_place():
    assert token_ids([1, 2.0], "input_ids") == [1, 2]
    with pytest.raises(InvalidRequest) as e:
        token_ids([1, U32], "prompt", "prompt[2]")
    assert e.value.param == "prompt" and "prompt[2][1]" in e.value.message


# --- the sweep: no number of any size reaches protobuf unchecked ---------------------------------

EDGES = ["0", "-0.0", "1", "-1", "1.5", "1e19", "-1e19", "2.0", "9007199254740993",
         *(str(v) for b in (2**31, 2**32, 2**53, 2**63, 2**64) for v in (b - 1, b, -b - 1, -b))]
ALL_FIELDS = [(e, f, ctx) for e, f, _, _, ctx in INT_FIELDS] + [
    (e, f, {}) for e in ("chat", "completions") for f, _, _ in FLOAT_FIELDS]


@pytest.mark.parametrize("endpoint,field,ctx", ALL_FIELDS, ids=[f"{c[0]}-{c[1]}" for c in ALL_FIELDS])
def test_every_edge_value_is_carried_or_a_400_naming_the_field(endpoint, field, ctx):
    for literal in EDGES:
        try:
            build(endpoint, body(endpoint, {field: literal}, **ctx))
        except InvalidRequest as e:
            assert e.param == field, (literal, e.message)
