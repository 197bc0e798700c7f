"""The shipped Envoy config validates, renders for any ports, and boots with OpenAI- or Anthropic-shaped errors."""

from __future__ import annotations

import concurrent.futures
import subprocess

import httpx
import pytest
import yaml

from services.launcher.envoy_config import ENVOY_YAML, render
from services.launcher.plan import free_port
from services.launcher.processes import wait_port
from tests.conftest import ROOT

pytestmark = pytest.mark.deploy


def validate(envoy_bin: str, path) -> subprocess.CompletedProcess:
    return subprocess.run([envoy_bin, "--mode", "validate", "-c", str(path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_shipped_config_validates(envoy_bin):
    r = validate(envoy_bin, ENVOY_YAML)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "OK" in r.stdout + r.stderr


def test_config_keeps_stream_safety_settings():
    cfg = yaml.safe_load(ENVOY_YAML.read_text())
    hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    v1 = next(r for r in routes if r["match"].get("prefix") == "/v1/")
    assert v1["route"]["timeout"] == "0s"  # streams must not hit the 15 s default
    transcoder = next(f for f in hcm["http_filters"] if f["name"].endswith("grpc_json_transcoder"))
    assert transcoder["typed_config"]["max_request_body_size"] == 32 << 20
    names = [f["name"] for f in hcm["http_filters"]]
    assert names.index("envoy.filters.http.lua") < names.index("envoy.filters.http.grpc_json_transcoder")


def test_rendered_config_with_replicas_validates(envoy_bin, tmp_path):
    path = tmp_path / "envoy.yaml"
    path.write_text(render(listen_host="127.0.0.1", listen_port=18000, admin_port=18001,
                           gateways=[("127.0.0.1", 19100), ("127.0.0.1", 19101)]))
    cluster = yaml.safe_load(path.read_text())["static_resources"]["clusters"][0]
    assert len(cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]) == 2
    r = validate(envoy_bin, path)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.fixture
def lone_envoy(envoy_bin, tmp_path):
    """Envoy with no gateway behind it: everything it answers is a local reply."""
    port, admin = free_port(), free_port()
    path = tmp_path / "envoy.yaml"
    path.write_text(render(listen_host="127.0.0.1", listen_port=port, admin_port=admin,
                           gateways=[("127.0.0.1", free_port())]))
    proc = subprocess.Popen([envoy_bin, "-c", str(path), "--concurrency", "1", "--base-id", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import time

    assert wait_port(port, time.monotonic() + 20)
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    assert proc.wait(10) == 0


def test_local_replies_are_openai_errors(lone_envoy):
    r = httpx.get(f"{lone_envoy}/v1/nope", timeout=10)
    assert r.status_code == 404
    assert r.json()["error"]["message"]
    down = httpx.get(f"{lone_envoy}/v1/models", timeout=10)
    assert down.status_code == 503 and down.json()["error"]["message"]
    assert down.headers["content-type"] == "application/json"


def test_local_replies_on_the_anthropic_routes_are_anthropic_errors(lone_envoy):
    """No gateway: Anthropic's 529 overloaded_error (its SDK retries it), not an OpenAI 503."""
    import anthropic

    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        down = httpx.post(f"{lone_envoy}{path}", json={"model": "m", "max_tokens": 5, "messages": []}, timeout=10)
        assert down.status_code == 529, down.text
        assert down.headers["content-type"] == "application/json"
        body = down.json()
        assert body["type"] == "error" and body["error"]["type"] == "overloaded_error" and body["error"]["message"]
    client = anthropic.Anthropic(base_url=lone_envoy, api_key="unused", max_retries=0, timeout=10)
    with pytest.raises(anthropic.OverloadedError):
        client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    client.close()
    assert httpx.get(f"{lone_envoy}/v1/models", timeout=10).status_code == 503  # the OpenAI routes keep theirs


# What no body may carry: Envoy's own texts and filter names, proto and gRPC names, addresses.
INTERNALS = ("envoy", "upstream", "transcode", "grpc", "meshfront.", "google.", "127.0.0.1", "codec", "reset",
             "Could not", "delayed connect", "healthy")


def assert_api_error(r: httpx.Response, status: int, *, anthropic: bool = False) -> dict:
    """``r`` is ``status`` with an API-shaped JSON error that names nothing internal; its ``error`` object."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    if anthropic:
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    else:
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["message"] and body["error"]["type"], body
    assert not [word for word in INTERNALS if word.lower() in r.text.lower()], r.text
    return body["error"]


def example_path(template: str) -> str:
    return (template.replace("{model_id}", "org/model").replace("{response_id}", "resp_1").replace("{name}", "a.js")
            .replace("{video_id}", "video_1").replace("{media_id}", "A" * 43).replace("{file_id}", "file-1")
            .replace("{batch_id}", "batch_1"))


def test_every_route_takes_its_methods_and_a_wrong_method_is_405_with_allow(lone_envoy):
    """The Lua route table agrees with routes.ENDPOINTS (which tests/unit/gateway/test_openapi.py holds equal
    to the descriptor Envoy transcodes): a served (method, path) reaches for the gateway (503 without one),
    any other method is a 405 naming the allowed ones."""
    from services.gateway.http_api.routes import ENDPOINTS

    allowed: dict[str, set[str]] = {}
    for e in ENDPOINTS:
        allowed.setdefault(e.path, set()).add(e.method.upper())
    served = [(method, example_path(template)) for template, methods in allowed.items() for method in methods]
    with httpx.Client(base_url=lone_envoy, timeout=10) as http:
        # Each served route's 503 waits out Envoy's retries of the missing gateway (seconds): asked all at once.
        with concurrent.futures.ThreadPoolExecutor(len(served)) as pool:
            answers = pool.map(lambda mp: http.request(mp[0], mp[1], json={} if mp[0] == "POST" else None), served)
            for (method, path), r in zip(served, answers, strict=True):
                assert r.status_code in (503, 529), f"{method} {path}: {r.status_code} {r.text}"
        for template, methods in allowed.items():
            path = example_path(template)
            for method in {"GET", "POST", "DELETE", "PUT", "PATCH"} - methods:
                r = http.request(method, path)
                err = assert_api_error(r, 405, anthropic=path.startswith("/v1/messages"))
                assert set(r.headers["allow"].split(", ")) == methods, (method, path, r.headers["allow"])
                assert method in err["message"] and path in err["message"]


def test_an_unknown_route_is_an_api_404(lone_envoy):
    for path in ("/v1/nope", "/", "/v1/responses/resp_1/input_items", "/v1/models/", "/v2/models"):
        err = assert_api_error(httpx.get(f"{lone_envoy}{path}", timeout=10), 404)
        assert err["type"] == "not_found_error" and path in err["message"]
    assert_api_error(httpx.post(f"{lone_envoy}/v1/messages/nope", json={}, timeout=10), 404, anthropic=True)


def test_query_parameters_are_ignored(lone_envoy):
    """The Anthropic beta client's ?beta=true and Azure's ?api-version= reach the gateway (here: none, so 503
    or Anthropic's 529) instead of a 400 naming google.api.HttpBody."""
    for path in ("/v1/chat/completions?api-version=2024-10-21", "/v1/embeddings?x=1&y"):
        assert_api_error(httpx.post(f"{lone_envoy}{path}", json={}, timeout=10), 503)
    assert_api_error(httpx.post(f"{lone_envoy}/v1/messages?beta=true", json={}, timeout=10), 529, anthropic=True)
    assert_api_error(httpx.get(f"{lone_envoy}/v1/models?limit=5", timeout=10), 503)


def test_a_url_that_is_not_utf8_is_a_400_naming_the_parameter(lone_envoy):
    for method, path, param in (("GET", "/v1/responses/%ff%fe", "response_id"),
                                ("DELETE", "/v1/responses/resp_%C3", "response_id"),
                                ("GET", "/v1/models/org/%ff", "model_id"),
                                ("GET", "/v1/models/%ED%A0%80", "model_id"),  # a UTF-16 surrogate
                                ("GET", "/docs/assets/%C0%AF", "name")):  # an overlong "/"
        err = assert_api_error(httpx.request(method, f"{lone_envoy}{path}", timeout=10), 400)
        assert err["param"] == param and "UTF-8" in err["message"], (path, err)
    err = assert_api_error(httpx.post(f"{lone_envoy}/v1/chat/completions?q=%ff", json={}, timeout=10), 400)
    assert "query" in err["message"]
    # Valid UTF-8, escaped or not, passes on to the gateway.
    assert_api_error(httpx.get(f"{lone_envoy}/v1/models/caf%C3%A9-%F0%9F%98%80", timeout=10), 503)


def test_oversized_or_undecodable_headers_are_refused_naming_the_header(lone_envoy):
    """Under gRPC's metadata limits at the gateway, refused before: a 431/414 naming what was too large,
    never the 429 "received metadata size exceeds hard limit" that SDKs retry."""
    big = "a" * 60_000
    err = assert_api_error(httpx.get(f"{lone_envoy}/v1/models", headers={"x-request-id": big}, timeout=10), 431)
    assert err["param"] == "x-request-id" and "x-request-id" in err["message"] and big not in err["message"]
    err = assert_api_error(httpx.get(f"{lone_envoy}/v1/models", headers={"authorization": "Bearer " + "k" * 20_000},
                                     timeout=10), 431)
    assert err["param"] == "authorization"
    many = {f"x-h{i}": "v" * 7000 for i in range(5)}
    err = assert_api_error(httpx.get(f"{lone_envoy}/v1/models", headers=many, timeout=10), 431)
    assert "total" in err["message"]
    assert_api_error(httpx.get(f"{lone_envoy}/v1/responses/resp_{'x' * 9000}", timeout=10), 414)
    err = assert_api_error(httpx.post(f"{lone_envoy}/v1/messages", json={}, headers={"x-api-key": "k" * 9000},
                                      timeout=10), 431, anthropic=True)
    assert "x-api-key" in err["message"]
    err = assert_api_error(httpx.get(f"{lone_envoy}/v1/models", headers={"x-note": b"caf\xe9"}, timeout=10), 400)
    assert err["param"] == "x-note"


def test_oversized_metadata_of_a_native_grpc_call_is_invalid_argument(lone_envoy):
    import grpc

    with grpc.insecure_channel(lone_envoy.removeprefix("http://")) as channel:
        live = channel.unary_unary("/inference.GRPCInferenceService/ServerLive",
                                   request_serializer=bytes, response_deserializer=bytes)
        with pytest.raises(grpc.RpcError) as e:
            live(b"", metadata=(("x-request-id", "r" * 60_000),), timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "x-request-id" in e.value.details()


def test_envoys_own_replies_to_native_grpc_calls_are_plain_fixed_text(lone_envoy):
    """Their body becomes grpc-message: neither an HTTP error document nor Envoy's "no healthy upstream"."""
    import grpc

    with grpc.insecure_channel(lone_envoy.removeprefix("http://")) as channel:
        for method, code, text in (("/inference.GRPCInferenceService/ServerLive", grpc.StatusCode.UNAVAILABLE,
                                    "The service is unavailable (restarting or overloaded); try again."),
                                   ("/no.such.Service/Call", grpc.StatusCode.UNIMPLEMENTED, "Unknown method.")):
            call = channel.unary_unary(method, request_serializer=bytes, response_deserializer=bytes)
            with pytest.raises(grpc.RpcError) as e:
                call(b"", timeout=10)
            assert (e.value.code(), e.value.details()) == (code, text)


def test_envoys_own_replies_name_nothing_internal(lone_envoy):
    """Local replies (no gateway: 503/529; the codec's 400 and 431) in the API's shape, with fixed text."""
    import socket

    assert_api_error(httpx.get(f"{lone_envoy}/health", timeout=10), 503)
    assert_api_error(httpx.post(f"{lone_envoy}/v1/chat/completions", json={}, timeout=10), 503)
    assert_api_error(httpx.post(f"{lone_envoy}/v1/messages/count_tokens", json={}, timeout=10), 529, anthropic=True)
    huge = {f"x-h{i}": "v" * 8000 for i in range(13)}  # past max_request_headers_kb: the codec refuses it
    r = httpx.get(f"{lone_envoy}/v1/models", headers=huge, timeout=10)
    assert_api_error(r, 431)
    host, port = lone_envoy.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"GET /v1/models/\xff HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), raw
    assert_api_error(httpx.Response(400, headers={"content-type": "application/json"}, content=body), 400)


@pytest.fixture
def envoy_over_bare_statuses(envoy_bin, tmp_path):
    """Envoy over a gRPC server that answers like the gateway's gRPC layer does when no servicer code ran (a
    request it could not parse, a metadata limit, a server going away): a bare status, no x-meshfront
    trailers, with gRPC's and Python's own text."""
    from concurrent import futures

    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc
    from meshfront.gateway.v1 import anthropic_pb2_grpc, gateway_pb2_grpc

    class Bare(gateway_pb2_grpc.GatewayServiceServicer):
        def ListModels(self, request, context):
            context.abort(grpc.StatusCode.INTERNAL, "Unexpected <class 'google.protobuf.message.DecodeError'>: "
                                                    "Error parsing message with type 'meshfront.gateway.v1.X'")

        def GetModel(self, request, context):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "received metadata size exceeds hard limit")

    class BareAnthropic(anthropic_pb2_grpc.AnthropicServiceServicer):
        def CountTokens(self, request, context):
            context.abort(grpc.StatusCode.UNAVAILABLE, "Server is shutting down (ipv4:127.0.0.1:9100)")

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    gateway_pb2_grpc.add_GatewayServiceServicer_to_server(Bare(), server)
    anthropic_pb2_grpc.add_AnthropicServiceServicer_to_server(BareAnthropic(), server)
    checks = health.HealthServicer()
    checks.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    upstream = server.add_insecure_port("127.0.0.1:0")
    server.start()
    port, admin = free_port(), free_port()
    path = tmp_path / "envoy.yaml"
    path.write_text(render(listen_host="127.0.0.1", listen_port=port, admin_port=admin,
                           gateways=[("127.0.0.1", upstream)]))
    proc = subprocess.Popen([envoy_bin, "-c", str(path), "--concurrency", "1", "--base-id", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import time

    assert wait_port(port, time.monotonic() + 20)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20  # until the health check lets the upstream in
    while httpx.get(f"{url}/v1/models", timeout=10).status_code == 503 and time.monotonic() < deadline:
        time.sleep(0.1)
    yield url
    proc.terminate()
    assert proc.wait(10) == 0
    server.stop(0)


def test_a_bare_grpc_status_gets_fixed_text_and_no_retryable_429(envoy_over_bare_statuses):
    url = envoy_over_bare_statuses
    err = assert_api_error(httpx.get(f"{url}/v1/models", timeout=10), 500)
    assert "DecodeError" not in err["message"] and err["type"] == "internal_server_error"
    # gRPC's RESOURCE_EXHAUSTED is one of its size limits here, not a rate limit the SDKs would retry.
    assert_api_error(httpx.get(f"{url}/v1/models/m", timeout=10), 400)
    err = assert_api_error(httpx.post(f"{url}/v1/messages/count_tokens", json={}, timeout=10), 529, anthropic=True)
    assert err["type"] == "overloaded_error"
