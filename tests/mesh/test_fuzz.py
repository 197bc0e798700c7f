"""Request fuzzing (reliability.md V1): 10,000+ generated requests, no 5xx, no crash.

Hypothesis builds chat and completions bodies from the OpenAI field names with values of every JSON
type (valid ones included, so some requests run end to end on the mocker). Every numeric field
(sampling, stop, logprobs, n, seed, stream_options, nvext, token-id prompts, structured outputs)
also draws from the whole JSON number range: integers past every proto type (int32, uint32,
int64, uint64 and beyond 64 bits), negative ones, floats where integers are expected, huge and tiny
floats, NaN/Infinity, and booleans. They go straight to the gateway over gRPC as raw ``HttpBody``
(what Envoy's transcoder sends), 50 at a time on a thread pool; a sample also goes through Envoy as
HTTP. KServe ``ModelInfer`` requests are mixed in, with every sampling parameter drawn from every
``InferParameter`` kind and ``input_ids`` tensors of every integer type over their whole range.

A request passes when the answer is a success or a 4xx: never a 5xx trailer, an INTERNAL/UNKNOWN
status (protobuf's "Value out of range" surfaced as one), or a gateway that stopped answering; and
every 4xx carries the OpenAI error shape (KServe: INVALID_ARGUMENT or NOT_FOUND with our ErrorInfo).
"""

from __future__ import annotations

import concurrent.futures
import json

import grpc
import httpx
import pytest
from google.api import httpbody_pb2
from google.rpc import error_details_pb2, status_pb2
from meshfront.gateway.v1 import gateway_pb2_grpc

from services.gateway.kserve import protocol
from services.gateway.kserve.request import SAMPLING_PARAMS
from tests.conftest import require_module
from tests.mesh.conftest import DEMO

pytestmark = pytest.mark.mesh

hypothesis = require_module("hypothesis")
st = hypothesis.strategies

BATCH = 50
BATCHES = 205  # 10,250 bodies
THROUGH_ENVOY_EVERY = 10  # one body of every 10th batch also goes through Envoy over HTTP

# Integers around every proto integer type's edges, and JSON integers beyond 64 bits (orjson reads
# those as floats).
_EDGES = sorted({v for b in (2**31, 2**32, 2**53, 2**63, 2**64) for v in (b - 1, b, b + 1, -b - 1, -b, -b + 1)}
                | {0, -1, 1, 99999999999, 1099511627776, 10**30, -(10**30)})
huge_ints = st.one_of(st.integers(), st.integers(-2**70, 2**70), st.sampled_from(_EDGES))
# The whole JSON number range, and booleans (Python's bool is an int): what every numeric field gets.
numbers = st.one_of(huge_ints, huge_ints, st.floats(allow_nan=False, allow_infinity=False), st.floats(),
                    st.sampled_from([0.5, -0.5, 2.0, 16.0, 1e-300, 1e300, 1e39]), st.booleans())

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(allow_nan=False),
                    st.text(max_size=20))
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                           max_leaves=8)
small_ints = st.integers(-3, 40)
wild = st.one_of(numbers, numbers, json_values)  # what a wild field holds

# Bodies are valid but for at most two wild fields, so that a bad number reaches the code past
# parsing (building the protos, the preprocessor, the worker) rather than stopping at the first
# other mistake. Every body has a wild field, but a wild value is sometimes valid, and those run end to
# end on the mocker (about one in ten); valid values stay small (max_tokens <= 4) to keep the runtime.
VALID_COMMON = {
    "max_tokens": st.integers(1, 4), "temperature": st.floats(0, 2), "top_p": st.floats(0, 1),
    "min_p": st.floats(0, 1), "top_k": st.sampled_from([-1, 1, 5, 50]), "seed": st.integers(-2**63, 2**64 - 1),
    "n": st.integers(1, 2), "stream": st.booleans(), "stop": st.lists(st.text(min_size=1, max_size=5), max_size=3),
    "presence_penalty": st.floats(-2, 2), "frequency_penalty": st.floats(-2, 2),
    "repetition_penalty": st.floats(0.1, 2), "min_tokens": st.integers(0, 4), "ignore_eos": st.booleans(),
    "include_stop_str_in_output": st.booleans(), "skip_special_tokens": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "structured_outputs": st.sampled_from([{"json_object": True}, {"choice": ["yes", "no"]}]),
    "logit_bias": st.just({}), "user": st.text(max_size=5),
    "nvext": st.fixed_dictionaries({}, optional={
        "greed_sampling": st.booleans(), "annotations": st.lists(st.sampled_from(["request_id", "token_ids",
                                                                                  "formatted_prompt"])),
        "extra_fields": st.lists(st.sampled_from(["worker_id", "timing", "routed_experts"])),
        "max_thinking_tokens": st.integers(0, 64), "agent_hints": st.fixed_dictionaries({"priority": small_ints}),
        "session_control": st.fixed_dictionaries({"session_id": st.text(min_size=1, max_size=6)}),
        # The fuzzed meshes' workers have no data-parallel ranks: rank 0 is theirs, any other a 400 (dp_pins.py).
        "dp_rank": st.just(0)}),
}
# A pin the gateway must refuse. A well-formed pin (a uint64) to a worker that does not exist is
# routed, and the router answers 400 "names worker N, which does not serve model" (tests/unit/router/test_pins.py),
# left out here so that this test stays about what the gateway accepts.
bad_pins = numbers.filter(lambda v: isinstance(v, (bool, float)) or not 0 <= v < 2**64)
# Fields that are only ever wild (their valid values need context the fuzz does not build), and
# nested numbers: each is an object whose one field draws from every number.
WILD_COMMON = {
    "stream_options": st.one_of(st.fixed_dictionaries({"include_usage": numbers}), wild),
    "nvext": st.one_of(st.fixed_dictionaries({"backend_instance_id": bad_pins}),
                       st.fixed_dictionaries({"max_thinking_tokens": numbers}),
                       st.fixed_dictionaries({"agent_hints": st.fixed_dictionaries({"priority": numbers})}),
                       st.fixed_dictionaries({"session_control": st.fixed_dictionaries(
                           {"session_id": st.just("s"), "timeout": numbers})}),
                       st.fixed_dictionaries({"dp_rank": numbers}), wild),
    "structured_outputs": st.one_of(st.fixed_dictionaries({"json_object": numbers}),
                                    st.fixed_dictionaries({"choice": st.lists(numbers, min_size=1, max_size=2)}),
                                    wild),
    "logit_bias": st.one_of(st.dictionaries(st.text(max_size=3), numbers, min_size=1, max_size=2), wild),
    "response_format": wild, "tools": wild, "tool_choice": wild, "unknown_field": wild, "model": wild,
}
token_ids = st.lists(st.one_of(st.integers(0, 200000), st.integers(0, 2**32 - 1), numbers), min_size=1, max_size=5)
VALID_CHAT = {**VALID_COMMON, "messages": st.lists(st.fixed_dictionaries(
    {"role": st.just("user"), "content": st.text(min_size=1, max_size=40)}), min_size=1, max_size=2),
    "max_completion_tokens": st.integers(1, 4), "logprobs": st.booleans(), "top_logprobs": st.integers(0, 20),
    "parallel_tool_calls": st.booleans(),
    # Current OpenAI and vendor fields (docs/openai-extensions.md).
    "reasoning_effort": st.sampled_from(["none", "minimal", "low", "medium", "high", "xhigh", "max"]),
    "verbosity": st.sampled_from(["low", "medium", "high"]), "store": st.booleans(),
    "service_tier": st.sampled_from(["auto", "default", "flex", "scale", "priority", "fast"]),
    "prompt_cache_key": st.text(max_size=6), "safety_identifier": st.text(max_size=6),
    "metadata": st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
    "modalities": st.just(["text"]), "thinking": st.one_of(st.booleans(), st.fixed_dictionaries(
        {"type": st.sampled_from(["enabled", "disabled", "auto"])}, optional={"budget_tokens": st.integers(1, 64)}))}
image_parts = st.lists(st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.one_of(st.text(max_size=10), wild)}),
    st.fixed_dictionaries({"type": st.just("image_url"), "image_url": st.one_of(st.fixed_dictionaries(
        {"url": st.one_of(st.sampled_from(["https://example.com/a.png", "data:image/png;base64,iVBORw0K",
                                           "data:image/png;base64,@@", "ftp://x"]), st.text(max_size=10))}), wild)}),
    st.fixed_dictionaries({"type": st.just("input_audio"), "input_audio": wild})), max_size=3)
WILD_CHAT = {**WILD_COMMON, "messages": st.one_of(st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", "developer", "bogus"]),
     "content": st.one_of(st.text(max_size=40), image_parts, wild)}), max_size=3), wild),
    "thinking": st.one_of(st.fixed_dictionaries({"type": st.just("enabled"), "budget_tokens": numbers}), wild)}
VALID_COMPLETIONS = {**VALID_COMMON, "prompt": st.one_of(
    st.text(min_size=1, max_size=30), st.lists(st.text(min_size=1, max_size=10), min_size=1, max_size=2),
    st.lists(st.integers(0, 1000), min_size=1, max_size=5)), "logprobs": st.integers(0, 5), "echo": st.booleans(),
    "best_of": st.just(1)}
WILD_COMPLETIONS = {**WILD_COMMON, "suffix": wild,
                    "prompt": st.one_of(token_ids, st.lists(token_ids, min_size=1, max_size=2), wild)}
NUMERIC = {"max_tokens", "max_completion_tokens", "temperature", "top_p", "min_p", "top_k", "seed", "n",
           "logprobs", "top_logprobs", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens",
           "best_of", "prompt", "stream_options", "nvext", "structured_outputs", "logit_bias", "thinking"}


# A field that needs another one to be checked at all: the other gets this value (unless it is wild).
_NEEDS = {"stream_options": ("stream", True), "top_logprobs": ("logprobs", True)}


def _body(valid: dict, wild_fields: dict, required: tuple[str, ...]):
    """``required`` plus up to six optional valid fields; up to two fields wild (numeric ones more often),
    the model or prompt maybe dropped (max_tokens stays unless wild, bounding the generation)."""
    every = sorted(valid.keys() | wild_fields.keys())
    numeric = sorted(NUMERIC & set(every))

    def build(picked):
        optional, wild_keys, dropped = picked
        keys = (set(required) | optional | wild_keys) - set(dropped)
        fields = {k: wild_fields.get(k, wild) if k in wild_keys else valid[k] for k in keys}
        for key, (needed, value) in _NEEDS.items():
            if key in keys and needed in valid and needed not in wild_keys:
                fields[needed] = st.just(value)
        return st.fixed_dictionaries(dict(sorted(fields.items())))

    wild_keys = st.sets(st.sampled_from(numeric), min_size=1, max_size=2) | st.sets(st.sampled_from(every), min_size=1,
                                                                                   max_size=2)
    return st.tuples(st.sets(st.sampled_from(sorted(valid)), max_size=6), wild_keys,
                     st.sampled_from([()] * 18 + [(required[0],), (required[1],)])).flatmap(build)


_REQUIRED = {"model": st.just(DEMO)}
chat_bodies = _body({**VALID_CHAT, **_REQUIRED}, WILD_CHAT, ("model", "messages", "max_tokens")).map(
    lambda b: ("chat", b))
completion_bodies = _body({**VALID_COMPLETIONS, **_REQUIRED}, WILD_COMPLETIONS, ("model", "prompt", "max_tokens")).map(
    lambda b: ("completions", b))
raw_bodies = st.one_of(st.binary(max_size=40), st.text(max_size=40).map(str.encode)).map(lambda b: ("chat", b))

# KServe: valid parameters but for up to two wild ones, drawn from every InferParameter kind over its
# whole range; ``input_ids`` of every integer type, valid or over the type's whole range.
_I64, _U64 = 2**63, 2**64
infer_params = st.one_of(
    st.tuples(st.just("int64_param"), st.one_of(small_ints, st.integers(-_I64, _I64 - 1))),
    st.tuples(st.just("uint64_param"), st.one_of(small_ints.map(abs), st.integers(0, _U64 - 1))),
    st.tuples(st.just("double_param"), st.one_of(st.floats(-3, 3), st.floats())),
    st.tuples(st.just("bool_param"), st.booleans()),
    st.tuples(st.just("string_param"), st.text(max_size=8)))


def _param(kind, values):
    return st.tuples(st.just(kind), values)


VALID_PARAMS = {
    "max_tokens": _param("int64_param", st.integers(1, 4)), "temperature": _param("double_param", st.floats(0, 2)),
    "top_p": _param("double_param", st.floats(0, 1)), "min_p": _param("double_param", st.floats(0, 1)),
    "top_k": _param("int64_param", st.sampled_from([-1, 1, 5])),
    "seed": st.one_of(_param("int64_param", st.integers(-_I64, _I64 - 1)),
                      _param("uint64_param", st.integers(0, _U64 - 1))),
    "frequency_penalty": _param("double_param", st.floats(-2, 2)),
    "presence_penalty": _param("double_param", st.floats(-2, 2)),
    "repetition_penalty": _param("double_param", st.floats(0.1, 2)),
    "min_tokens": _param("int64_param", st.integers(0, 4)),
    "ignore_eos": _param("bool_param", st.booleans()), "stop": _param("string_param", st.text(min_size=1, max_size=4)),
    "include_stop_str_in_output": _param("bool_param", st.booleans()),
    "skip_special_tokens": _param("bool_param", st.booleans()),
}
assert VALID_PARAMS.keys() == SAMPLING_PARAMS
_ID_TYPES = {"INT32": ("int_contents", -2**31, 2**31 - 1), "INT64": ("int64_contents", -_I64, _I64 - 1),
             "UINT32": ("uint_contents", 0, 2**32 - 1), "UINT64": ("uint64_contents", 0, _U64 - 1)}
kserve_ids = st.sampled_from(sorted(_ID_TYPES)).flatmap(lambda dt: st.tuples(st.just(dt), st.lists(
    st.one_of(st.integers(0, 1000), st.integers(0, 1000), st.integers(_ID_TYPES[dt][1], _ID_TYPES[dt][2])),
    min_size=1, max_size=4)))


def _kserve_params(picked):
    optional, wild_keys = picked
    keys = {"max_tokens"} | optional | wild_keys
    return st.fixed_dictionaries({k: infer_params if k in wild_keys else VALID_PARAMS[k] for k in sorted(keys)})


kserve_requests = st.tuples(
    st.one_of(st.just(None), kserve_ids),
    st.tuples(st.sets(st.sampled_from(sorted(VALID_PARAMS)), max_size=5),
              st.sets(st.sampled_from(sorted(SAMPLING_PARAMS | {"chat", "stream"})), min_size=1, max_size=2)).flatmap(
        _kserve_params),
).map(lambda r: ("kserve", r))

cases = st.one_of(chat_bodies, chat_bodies, completion_bodies, kserve_requests, raw_bodies)


def _kserve(ids, params) -> bytes:
    req = protocol.ModelInferRequest(model_name=DEMO, id="fuzz")
    if ids is None:
        req.inputs.add(name="text_input", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"Hi")
    else:
        datatype, values = ids
        t = req.inputs.add(name="input_ids", datatype=datatype, shape=[len(values)])
        getattr(t.contents, _ID_TYPES[datatype][0]).extend(values)
    for key, (kind, value) in params.items():
        setattr(req.parameters[key], kind, value)
    return req.SerializeToString()


def _encode(endpoint: str, body) -> bytes:
    if endpoint == "kserve":
        return _kserve(*body)
    return body if isinstance(body, bytes) else json.dumps(body).encode()


def _openai_error_problem(body: str) -> str | None:
    """Why a 4xx body is not an OpenAI error object, or None."""
    try:
        err = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return "not an OpenAI error body"
    if not (isinstance(err, dict) and isinstance(err.get("message"), str) and err["message"]
            and isinstance(err.get("type"), str) and "param" in err and "code" in err):
        return "an incomplete OpenAI error"
    return None


def _our_error_info(e: grpc.RpcError) -> bool:
    for key, value in e.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            for detail in status_pb2.Status.FromString(value).details:
                info = error_details_pb2.ErrorInfo()
                if detail.Unpack(info) and info.domain == "meshfront":
                    return True
    return False


def _call(channel, stub, endpoint: str, data: bytes) -> str | None:
    """Runs one request to the end; returns a description of a server error, or None."""
    if endpoint == "kserve":
        infer = channel.unary_unary(f"/{protocol.SERVICE}/ModelInfer")
        try:
            infer(data, timeout=30)
        except grpc.RpcError as e:
            if e.code() not in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND) \
                    or not _our_error_info(e) or not e.details():
                return f"kserve {e.code().name} {e.details()!r} for {protocol.ModelInferRequest.FromString(data)}"
        return None
    method = stub.ChatCompletions if endpoint == "chat" else stub.Completions
    call = method(httpbody_pb2.HttpBody(content_type="application/json", data=data), timeout=30)
    try:
        for _ in call:
            pass
    except grpc.RpcError as e:
        trailers = dict(e.trailing_metadata() or ())
        status = int(trailers.get("x-meshfront-status", "0"))
        if status >= 500 or e.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN,
                                          grpc.StatusCode.DEADLINE_EXCEEDED) or not status:
            return f"{e.code().name} {status} {e.details()!r} for {data[:300]!r}"
        problem = _openai_error_problem(trailers.get("x-meshfront-body", ""))
        if problem:
            return f"{status} {problem}: {trailers.get('x-meshfront-body')!r} for {data[:300]!r}"
    return None


def test_generated_bodies_never_get_a_server_error(mesh):
    channel = grpc.insecure_channel(f"127.0.0.1:{mesh.plan.gateway_ports[0]}")
    stub = gateway_pb2_grpc.GatewayServiceStub(channel)
    pool = concurrent.futures.ThreadPoolExecutor(16)
    sent = {"grpc": 0, "envoy": 0, "kserve": 0}
    failures: list[str] = []
    http = httpx.Client(base_url=mesh.url, timeout=30)

    @hypothesis.settings(max_examples=BATCHES, deadline=None, derandomize=True, database=None,
                         suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(st.lists(cases, min_size=BATCH, max_size=BATCH))
    def batch(bodies):
        found = [f for f in pool.map(lambda c: _call(channel, stub, c[0], _encode(*c)), bodies) if f]
        sent["grpc"] += len(bodies)
        sent["kserve"] += sum(c[0] == "kserve" for c in bodies)
        if sent["grpc"] // BATCH % THROUGH_ENVOY_EVERY == 0:
            endpoint, body = next((c for c in bodies if c[0] != "kserve"), bodies[0])
            if endpoint != "kserve":
                path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
                data = _encode(endpoint, body)
                r = http.post(path, content=data, headers={"content-type": "application/json"})
                sent["envoy"] += 1
                if r.status_code >= 500:
                    found.append(f"envoy {r.status_code} {r.text[:200]} for {data[:300]!r}")
                elif r.status_code >= 400 and (problem := _openai_error_problem(r.text)):
                    found.append(f"envoy {r.status_code} {problem}: {r.text[:200]} for {data[:300]!r}")
        failures.extend(found)

    try:
        batch()
    finally:
        pool.shutdown()
        channel.close()
        http.close()
    assert not failures, (len(failures), failures[:5])
    assert sent["grpc"] >= 10_000 and sent["envoy"] >= 20 and sent["kserve"] >= 1_000
    # The gateway is still healthy after all of that.
    assert httpx.get(f"{mesh.url}/health", timeout=5).status_code == 200
