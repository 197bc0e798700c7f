"""Extension points through Envoy: the example route extension and the example chat engine factory, loaded by the
gateway of one mesh (their flags in the gateway's service_args, as ``meshfront run --gateway-flag`` passes them),
and a second gateway of the same mesh without the factory, for what an unset factory serves."""

from __future__ import annotations

import sys
import time

import grpc
import httpx
import openai
import orjson
import pytest
from google.api import httpbody_pb2
from meshfront.gateway.v1 import gateway_pb2_grpc

from examples.engine_factory import policy
from services.launcher.plan import ProcessSpec, free_port
from services.launcher.processes import wait_port
from tests.conftest import sdk_client, stop_cleanly
from tests.mesh.conftest import DEMO, mocker, start_mesh, wait_until
from tests.mesh.test_metrics import parse, value

pytestmark = pytest.mark.mesh

ROUTES = "examples.route_extension.status_routes:routes"
FACTORY = "examples.engine_factory.policy:factory"
COUNT = [{"role": "user", "content": "Count to ten"}]
TEN = "one two three four five six seven eight nine ten"


@pytest.fixture(scope="module")
def ext_mesh(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    m = start_mesh(tmp_path_factory, [mocker(demo_model_dir, DEMO)],
                   service_args={"gateway": ("--frontend-route-extension", ROUTES, "--chat-engine-factory", FACTORY)})
    port = free_port()
    plan = m.plan
    m.start_process(ProcessSpec("gateway-plain", [
        sys.executable, "-m", "services.gateway", "--port", str(port), "--nats-url", plan.nats_url,
        "--preprocessor", plan.preprocessor_target, "--router", plan.router_target,
        "--postprocessor", plan.postprocessor_target], port, {"PYTHONUNBUFFERED": "1"}))
    assert wait_port(port, time.monotonic() + 30), m.logs("gateway-plain")
    m.plain_port = port
    yield m
    stop_cleanly(m)


@pytest.fixture(scope="module")
def http(ext_mesh):
    with httpx.Client(base_url=ext_mesh.url, timeout=30) as c:
        yield c


def test_a_route_answers_through_envoy_with_the_request_id_and_is_counted_in_metrics(ext_mesh, http):
    r = http.get("/example/status", headers={"x-request-id": "ext-status-1"})
    assert r.status_code == 200, r.text
    assert r.headers["x-request-id"] == "ext-status-1" and r.headers["content-type"] == "application/json"
    assert r.json() == {"ready": True, "models": [DEMO], "request_id": "ext-status-1"}
    made_up = http.get("/example/status")
    assert made_up.headers["x-request-id"] == made_up.json()["request_id"] != ""  # Envoy's, handed to the handler
    echoed = http.post("/example/echo", json={"text": "héllo"}, headers={"x-request-id": "ext-echo-1"})
    assert echoed.status_code == 200 and echoed.json() == {"text": "héllo", "length": 5}
    assert echoed.headers["x-request-id"] == "ext-echo-1"

    def counted() -> bool:
        families = parse(http.get("/metrics").text)
        return (value(families, "meshfront_gateway_requests", "_total", endpoint="/example/status", status="200") >= 2
                and value(families, "meshfront_gateway_requests", "_total", endpoint="/example/echo",
                          status="200") >= 1)
    wait_until(counted, 15, "the extension routes' requests in the edge's /metrics")


def test_a_route_error_is_openai_shaped_and_the_edge_refuses_what_no_route_takes(http):
    r = http.post("/example/echo", json={"words": 3}, headers={"x-request-id": "ext-bad-1"})
    assert r.status_code == 400 and r.headers["x-request-id"] == "ext-bad-1"
    assert r.json() == {"error": {"message": "'text' must be a string", "type": "invalid_request_error",
                                  "param": "text", "code": 400}}
    broken = http.post("/example/echo", content=b"{not json", headers={"content-type": "application/json"})
    assert broken.status_code == 400 and broken.json()["error"]["type"] == "invalid_request_error"
    assert "not valid JSON" in broken.json()["error"]["message"]
    wrong = http.get("/example/echo")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    assert wrong.json()["error"]["type"] == "invalid_request_error"
    unknown = http.get("/example/nope")
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "not_found_error"


def test_the_pre_hooks_change_shows_in_the_answer_and_it_refuses_in_openais_shape(ext_mesh):
    client = sdk_client(ext_mesh)
    answer = client.chat.completions.create(model=DEMO, messages=COUNT, max_tokens=64)
    assert answer.usage.completion_tokens == policy.MAX_TOKENS  # capped by the pre-hook, not the client's 64
    assert answer.choices[0].finish_reason == "length" and TEN.startswith(answer.choices[0].message.content)
    with pytest.raises(openai.PermissionDeniedError) as e:
        client.chat.completions.create(model=DEMO, max_tokens=8,
                                       messages=[{"role": "user", "content": "HAL, open the pod bay doors"}])
    assert e.value.status_code == 403
    assert e.value.body == {"message": "This request is refused by the deployment's policy",
                            "type": "permission_error", "param": "messages", "code": "policy_refused"}
    client.close()


def test_the_post_hook_sees_every_chunk_streamed_and_whole(ext_mesh, http):
    whole = http.post("/v1/chat/completions", json={"model": DEMO, "messages": COUNT})
    assert whole.status_code == 200 and whole.json()["system_fingerprint"] == policy.FINGERPRINT
    r = http.post("/v1/chat/completions", json={"model": DEMO, "messages": COUNT, "stream": True,
                                                "stream_options": {"include_usage": True}})
    assert r.status_code == 200, r.text
    frames = [f for f in r.text.split("\n\n") if f]
    assert frames[-1] == "data: [DONE]"
    chunks = [orjson.loads(f[len("data: "):]) for f in frames[:-1]]
    assert len(chunks) >= 3 and chunks[-1]["usage"]["completion_tokens"] == policy.MAX_TOKENS  # the usage chunk too
    assert [c["system_fingerprint"] for c in chunks] == [policy.FINGERPRINT] * len(chunks)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == \
        whole.json()["choices"][0]["message"]["content"]


def test_a_gateway_without_a_factory_serves_the_same_request_untouched(ext_mesh):
    body = orjson.dumps({"model": DEMO, "messages": COUNT, "max_tokens": 64})
    with grpc.insecure_channel(f"127.0.0.1:{ext_mesh.plain_port}") as channel:
        stub = gateway_pb2_grpc.GatewayServiceStub(channel)

        def answer() -> dict:
            call = stub.ChatCompletions(httpbody_pb2.HttpBody(content_type="application/json", data=body), timeout=30)
            return orjson.loads(b"".join(m.data for m in call))
        plain = answer()
    assert plain["choices"][0]["message"]["content"] == TEN and plain["choices"][0]["finish_reason"] == "stop"
    assert plain["usage"]["completion_tokens"] > policy.MAX_TOKENS
    assert plain.get("system_fingerprint") != policy.FINGERPRINT
