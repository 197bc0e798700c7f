"""Request fuzzing (reliability.md V1): 10,000+ generated bodies, no 5xx, no crash.

Hypothesis builds chat and completions bodies from the OpenAI field names with values of every JSON
type (valid ones included, so some requests run end to end on the mocker). They go straight to the
gateway over gRPC as raw ``HttpBody`` (what Envoy's transcoder sends), 50 at a time on a thread
pool; a sample also goes through Envoy as HTTP. A body passes when the answer is a success or a
4xx: never a 5xx trailer, an INTERNAL/UNKNOWN status, or a gateway that stopped answering.
"""

from __future__ import annotations

import concurrent.futures
import json

import grpc
import httpx
import pytest
from google.api import httpbody_pb2

from meshfront.gateway.v1 import gateway_pb2_grpc
from tests.conftest import require_module
from tests.mesh.conftest import DEMO

pytestmark = pytest.mark.mesh

hypothesis = require_module("hypothesis")
st = hypothesis.strategies

BATCH = 50
BATCHES = 205  # 10,250 bodies
THROUGH_ENVOY_EVERY = 10  # one body of every 10th batch also goes through Envoy over HTTP

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(allow_nan=False),
                    st.text(max_size=20))
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                           max_leaves=8)
small_ints = st.integers(-3, 40)
messages = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", "developer", "bogus"]),
     "content": st.one_of(st.text(max_size=40), json_values)}), max_size=3)
common_fields = {
    "model": st.one_of(st.just(DEMO), st.just(DEMO), st.text(max_size=10), json_values),
    "max_tokens": st.one_of(small_ints, json_values), "max_completion_tokens": small_ints,
    "temperature": st.one_of(st.floats(-1, 3), json_values), "top_p": st.floats(-0.5, 1.5),
    "top_k": small_ints, "seed": st.integers(-5, 2**65), "n": st.integers(-1, 4),
    "stream": st.booleans(), "stop": st.one_of(st.text(max_size=5), st.lists(st.text(max_size=5), max_size=5)),
    "logprobs": st.one_of(st.booleans(), small_ints), "top_logprobs": small_ints,
    "presence_penalty": st.floats(-3, 3), "frequency_penalty": st.floats(-3, 3), "min_tokens": small_ints,
    "ignore_eos": st.booleans(), "stream_options": json_values, "user": json_values,
    "response_format": json_values, "tools": json_values, "tool_choice": json_values,
    "logit_bias": json_values, "unknown_field": json_values,
}


def _body(endpoint_fields: dict):
    fields = {**common_fields, **endpoint_fields}
    return st.dictionaries(st.sampled_from(sorted(fields)), st.just(None), max_size=8).flatmap(
        lambda keys: st.fixed_dictionaries({k: fields[k] for k in keys}))


chat_bodies = _body({"messages": messages}).map(lambda b: ("chat", b))
completion_bodies = _body({"prompt": st.one_of(st.text(max_size=30), st.lists(st.text(max_size=10), max_size=3),
                                               st.lists(st.integers(-1, 200000), max_size=5), json_values),
                           "echo": st.booleans(), "suffix": json_values}).map(lambda b: ("completions", b))
raw_bodies = st.one_of(st.binary(max_size=40), st.text(max_size=40).map(str.encode)).map(lambda b: ("chat", b))
cases = st.one_of(chat_bodies, chat_bodies, completion_bodies, raw_bodies)


def _encode(body) -> bytes:
    return body if isinstance(body, bytes) else json.dumps(body).encode()


def _call(stub, endpoint: str, data: bytes) -> str | None:
    """Runs one request to the end; returns a description of a server error, or None."""
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
    return None


def test_generated_bodies_never_get_a_server_error(mesh):
    channel = grpc.insecure_channel(f"127.0.0.1:{mesh.plan.gateway_ports[0]}")
    stub = gateway_pb2_grpc.GatewayServiceStub(channel)
    pool = concurrent.futures.ThreadPoolExecutor(16)
    sent = {"grpc": 0, "envoy": 0}
    failures: list[str] = []
    http = httpx.Client(base_url=mesh.url, timeout=30)

    @hypothesis.settings(max_examples=BATCHES, deadline=None, derandomize=True, database=None,
                         suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(st.lists(cases, min_size=BATCH, max_size=BATCH))
    def batch(bodies):
        found = [f for f in pool.map(lambda c: _call(stub, c[0], _encode(c[1])), bodies) if f]
        sent["grpc"] += len(bodies)
        if sent["grpc"] // BATCH % THROUGH_ENVOY_EVERY == 0:
            endpoint, body = bodies[0]
            path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
            r = http.post(path, content=_encode(body), headers={"content-type": "application/json"})
            sent["envoy"] += 1
            if r.status_code >= 500:
                found.append(f"envoy {r.status_code} {r.text[:200]} for {_encode(body)[:300]!r}")
        failures.extend(found)

    try:
        batch()
    finally:
        pool.shutdown()
        channel.close()
        http.close()
    assert not failures, failures[:5]
    assert sent["grpc"] >= 10_000 and sent["envoy"] >= 20
    # The gateway is still healthy after all of that.
    assert httpx.get(f"{mesh.url}/health", timeout=5).status_code == 200
