"""KServe numbers (tritonclient parameters, ``input_ids`` tensors) are range-checked like the HTTP API's.

A value that does not fit the proto field it lands in is an InvalidRequest naming the parameter or
input, never protobuf's ValueError (which gRPC answered as UNKNOWN "Unexpected <class 'ValueError'>").
"""

from __future__ import annotations

import math
import struct

import pytest

from services.common.errors import InvalidRequest
from services.gateway.core.to_proto import completion_to_preprocess
from services.gateway.kserve import protocol
from services.gateway.kserve.request import SAMPLING_PARAMS, parse_request

pytestmark = pytest.mark.unit

U32, U64, I64 = 2**32, 2**64, 2**63
_CODES = {"INT32": "i", "INT64": "q", "UINT32": "I", "UINT64": "Q"}
_CONTENTS = {"INT32": "int_contents", "INT64": "int64_contents", "UINT32": "uint_contents",
             "UINT64": "uint64_contents"}


def request(params: dict | None = None, ids: list[int] | None = None, datatype: str = "INT64", *, raw=False):
    """A completion request: ``text_input`` or ``input_ids``, with typed parameters.

    A parameter value is ``(kind, value)`` to pick the InferParameter field, or a plain value
    (bool, int -> int64_param, float -> double_param, str).
    """
    req = protocol.ModelInferRequest(model_name="m", id="x")
    if ids is None:
        t = req.inputs.add(name="text_input", datatype="BYTES", shape=[1])
        t.contents.bytes_contents.append(b"hi")
    else:
        t = req.inputs.add(name="input_ids", datatype=datatype, shape=[len(ids)])
        if raw:
            req.raw_input_contents.append(struct.pack(f"<{len(ids)}{_CODES[datatype]}", *ids))
        else:
            getattr(t.contents, _CONTENTS[datatype]).extend(ids)
    for key, value in (params or {}).items():
        kind, value = value if isinstance(value, tuple) else (
            {bool: "bool_param", int: "int64_param", float: "double_param", str: "string_param"}[type(value)], value)
        setattr(req.parameters[key], kind, value)
    return req


def build(req):
    """Parses and builds the proto the gateway would send."""
    k = parse_request(req)
    return completion_to_preprocess(k.parsed, k.parsed.prompts[0], "r")


def rejects(req) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as e:
        build(req)
    assert e.value.message and "Value out of range" not in e.value.message
    return e.value


# --- input_ids -----------------------------------------------------------------------------------

@pytest.mark.parametrize("raw", [False, True])
@pytest.mark.parametrize("datatype,ids", [
    ("INT32", [-1, 1]), ("INT64", [-1, 1]), ("INT64", [99999999999, 1]), ("INT64", [U32]),
    ("INT64", [-I64]), ("INT64", [I64 - 1]), ("UINT64", [U64 - 1]), ("UINT64", [1, U32]),
])
def test_input_ids_beyond_uint32_or_negative_are_400(raw, datatype, ids):
    e = rejects(request(ids=ids, datatype=datatype, raw=raw))
    assert e.param == "input_ids" and "input_ids[" in e.message


@pytest.mark.parametrize("raw", [False, True])
@pytest.mark.parametrize("datatype", ["INT64", "UINT32", "UINT64"])
def test_input_ids_at_the_uint32_edges_reach_the_proto(raw, datatype):
    """Past the vocabulary is the preprocessor's 400; the gateway checks what a token id can hold."""
    assert list(build(request(ids=[0, U32 - 1], datatype=datatype, raw=raw)).tokens.ids) == [0, U32 - 1]


# --- parameters ----------------------------------------------------------------------------------

INT_PARAMS = {"max_tokens": (1, U32 - 1), "min_tokens": (0, U32 - 1), "top_k": (-1, 2**31 - 1),
              "seed": (-I64, U64 - 1)}
FLOAT_PARAMS = {"temperature": 2.0, "top_p": 1.0, "min_p": 1.0, "frequency_penalty": 2.0,
                "presence_penalty": 2.0, "repetition_penalty": 2.0}


def test_every_numeric_sampling_parameter_is_covered():
    assert {k for k in SAMPLING_PARAMS if k not in ("stop", "ignore_eos", "include_stop_str_in_output",
                                                    "skip_special_tokens")} == INT_PARAMS.keys() | FLOAT_PARAMS.keys()


def test_issue_example_top_k_as_a_tritonclient_parameter():
    e = rejects(request({"top_k": 1099511627776}))
    assert e.param == "top_k" and "2147483647" in e.message


@pytest.mark.parametrize("key", sorted(INT_PARAMS))
def test_integer_parameters(key):
    lo, hi = INT_PARAMS[key]
    bad = [True, False, 2.5, -0.5, "7", ("uint64_param", U64 - 1), ("double_param", 1e300),
           ("double_param", math.nan), ("double_param", math.inf), ("double_param", -math.inf)]
    if lo - 1 >= -I64:
        bad.append(lo - 1)
    if hi + 1 < U64:
        bad.append(("uint64_param", hi + 1) if hi + 1 >= I64 else hi + 1)
    for value in bad:
        if key == "seed" and value == ("uint64_param", U64 - 1):
            continue  # the largest seed there is
        e = rejects(request({key: value}))
        assert e.param == key, (value, e.message)
    for value in (lo if key != "top_k" else -1, ("uint64_param", hi) if hi >= I64 else hi, float(max(lo, 1))):
        build(request({key: value}))


@pytest.mark.parametrize("key", sorted(FLOAT_PARAMS))
def test_float_parameters(key):
    hi = FLOAT_PARAMS[key]
    for value in [math.nan, math.inf, -math.inf, hi + 0.5, 1e39, True, "0.5", ("uint64_param", U64 - 1),
                  -I64]:
        e = rejects(request({key: value}))
        assert e.param == key, (value, e.message)
    for value in (hi, 1, ("uint64_param", 1)):
        build(request({key: value}))


def test_control_parameters_must_be_booleans():
    for key in ("chat", "stream", "triton_enable_empty_final_response"):
        for value in (1, 1.0, ("uint64_param", 1)):
            with pytest.raises(InvalidRequest) as e:
                parse_request(request({key: value}))
            assert e.value.param == key
