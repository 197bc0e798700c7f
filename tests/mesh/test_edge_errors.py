"""Bad input decided at the edge, through the real Envoy and the official SDKs (issue 23).

Routes, methods, query parameters, URLs that are not UTF-8 and headers past gRPC's metadata limits are
answered by Envoy's Lua filter (deploy/envoy/envoy.yaml) before the gateway's gRPC server could refuse
them with its own text; long client values in errors are bounded (services/common/errors.py). The Envoy
config alone is checked against a lone Envoy in tests/deploy/test_envoy.py; here the whole mesh answers.
"""

from __future__ import annotations

import anthropic
import httpx
import numpy as np
import openai
import pytest

from tests.conftest import require_module
from tests.mesh.conftest import DEMO

pytestmark = pytest.mark.mesh

ASK = [{"role": "user", "content": "count to ten"}]


def error_of(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    return r.json()["error"]


def test_a_path_parameter_that_is_not_utf8_is_a_400_not_a_500_with_a_traceback(mesh):
    with httpx.Client(base_url=mesh.url, timeout=30) as http:
        for method, path, param in (("GET", "/v1/responses/%ff%fe", "response_id"),
                                    ("DELETE", "/v1/responses/%ff", "response_id"),
                                    ("GET", "/v1/models/%ff", "model_id")):
            err = error_of(http.request(method, path), 400)
            assert err["param"] == param and err["type"] == "invalid_request_error"
            assert "DecodeError" not in err["message"]
        # Valid UTF-8 goes on to the gateway, whose 404 echoes it (a non-ASCII trailer was a 500).
        err = error_of(http.get("/v1/models/caf%C3%A9"), 404)
        assert "café" in err["message"]
    assert "DecodeError" not in mesh.full_log("gateway-0")


def test_the_anthropic_beta_client_is_served(mesh):
    """Its releases before the pinned one post to /v1/messages?beta=true (the pinned one keeps the qualifier
    out of the URL, so it is sent here as they send it), which was a 400 naming google.api.HttpBody."""
    claude = anthropic.Anthropic(base_url=mesh.url, api_key="unused", max_retries=0, timeout=30)
    try:
        msg = claude.beta.messages.create(model=DEMO, max_tokens=3, messages=ASK)
        assert msg.content[0].text and msg.usage.output_tokens == 3
        msg = claude.beta.messages.create(model=DEMO, max_tokens=3, messages=ASK, extra_query={"beta": "true"})
        assert msg.content[0].text and msg.usage.output_tokens == 3
        with claude.beta.messages.stream(model=DEMO, max_tokens=3, messages=ASK, extra_query={"beta": "true"}) as s:
            assert s.get_final_message().usage.output_tokens == 3
        assert claude.beta.messages.count_tokens(model=DEMO, messages=ASK).input_tokens > 0
    finally:
        claude.close()


def test_an_azure_style_api_version_query_is_ignored(mesh):
    client = openai.OpenAI(base_url=f"{mesh.url}/v1", api_key="unused", max_retries=0, timeout=30,
                           default_query={"api-version": "2024-10-21"})
    try:
        out = client.chat.completions.create(model=DEMO, messages=ASK, max_tokens=3)
        assert out.usage.completion_tokens == 3
        assert DEMO in {m.id for m in client.models.list()}
        assert client.models.retrieve(DEMO).id == DEMO
    finally:
        client.close()


def test_a_wrong_method_is_405_with_allow_and_an_unknown_route_an_api_404(mesh):
    with httpx.Client(base_url=mesh.url, timeout=30) as http:
        wrong = http.get("/v1/chat/completions")
        err = error_of(wrong, 405)
        assert wrong.headers["allow"] == "POST" and "Could not resolve" not in err["message"]
        assert error_of(http.post("/v1/models"), 405)["type"] == "invalid_request_error"
        err = error_of(http.get("/v1/chat/nope"), 404)
        assert err["type"] == "not_found_error" and "transcode" not in wrong.text + err["type"]
    client = openai.OpenAI(base_url=f"{mesh.url}/v2", api_key="unused", max_retries=0, timeout=30)
    with pytest.raises(openai.NotFoundError):
        client.models.list()
    client.close()


def counting_client(mesh, **kw) -> tuple[openai.OpenAI, list[httpx.Request]]:
    """An SDK client with its default retries, and the list of every request it sends."""
    sent: list[httpx.Request] = []
    http = httpx.Client(event_hooks={"request": [sent.append]}, timeout=30)
    return openai.OpenAI(base_url=f"{mesh.url}/v1", max_retries=2, http_client=http, **kw), sent


def test_oversized_headers_are_a_431_naming_the_header_which_the_sdk_does_not_retry(mesh):
    """A 60 KB x-request-id or a 20 KB key was gRPC's 429 "received metadata size exceeds hard limit",
    which the OpenAI SDK retried."""
    client, sent = counting_client(mesh, api_key="k" * 20_000)
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model=DEMO, messages=ASK, max_tokens=3)
    assert e.value.status_code == 431 and len(sent) == 1
    assert e.value.body["param"] == "authorization" and "authorization" in e.value.message
    client.close()
    client, sent = counting_client(mesh, api_key="unused", default_headers={"x-request-id": "r" * 60_000})
    with pytest.raises(openai.APIStatusError) as e:
        client.models.list()
    assert e.value.status_code == 431 and len(sent) == 1 and e.value.body["param"] == "x-request-id"
    client.close()


def test_headers_under_the_edge_limit_reach_the_gateway(mesh):
    """21 KB of headers in all, each under 8 KiB: past gRPC's default 16 KiB at the gateway (always a 429
    before), within what the edge lets through."""
    headers = {f"x-trace-{i}": "t" * 7000 for i in range(3)}
    r = httpx.post(f"{mesh.url}/v1/chat/completions", headers=headers, timeout=30,
                   json={"model": DEMO, "messages": ASK, "max_tokens": 3})
    assert r.status_code == 200, r.text


def test_a_100_kb_previous_response_id_is_a_400_naming_it(mesh):
    """Its echo overran the gateway's trailers: a 502 "protocol error"."""
    body = {"model": DEMO, "input": "hi", "max_output_tokens": 3, "previous_response_id": "resp_" + "x" * 100_000}
    err = error_of(httpx.post(f"{mesh.url}/v1/responses", json=body, timeout=30), 400)
    assert err["param"] == "previous_response_id" and "100005 characters" in err["message"]
    # An unknown id of a plausible length is still the store's 404, its echo bounded all the same.
    body["previous_response_id"] = "resp_" + "y" * 120
    err = error_of(httpx.post(f"{mesh.url}/v1/responses", json=body, timeout=30), 404)
    assert err["param"] == "previous_response_id" and body["previous_response_id"] in err["message"]


def test_kserve_fields_past_grpcs_metadata_limits_get_their_error(mesh):
    """10,000 unknown parameters or a 1 MB model name were a 502/503 "protocol error" (the echo in the
    status overran the trailer limit); a 60 KB header a RESOURCE_EXHAUSTED from gRPC itself."""
    require_module("tritonclient")
    import tritonclient.grpc as triton
    from tritonclient.utils import InferenceServerException

    text = triton.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"hi"], dtype=np.object_))
    client = triton.InferenceServerClient(mesh.grpc_target)
    try:
        with pytest.raises(InferenceServerException) as e:
            client.infer(DEMO, [text], parameters={f"p{i}": 1 for i in range(10_000)})
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and "Unsupported parameter" in e.value.message()
        with pytest.raises(InferenceServerException) as e:
            client.infer("m" * (1 << 20), [text])
        assert e.value.status() == "StatusCode.NOT_FOUND" and e.value.message().endswith("does not exist.")
        assert len(e.value.message().encode()) <= 1024
        with pytest.raises(InferenceServerException) as e:
            client.infer(DEMO, [text], headers={"x-request-id": "r" * 60_000})
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and "x-request-id" in e.value.message()
    finally:
        client.close()


def test_a_kserve_request_that_does_not_parse_is_invalid_argument(mesh):
    """A model_name that is not UTF-8 (raw bytes: no client library writes one) was UNKNOWN naming
    DecodeError and inference.ModelInferRequest, with a traceback in the gateway's log."""
    import grpc

    raw = b"\x0a\x01\xff"  # field 1 (model_name), 1 byte: 0xff
    with grpc.insecure_channel(mesh.grpc_target) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as unary:
            infer(raw, timeout=30)
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        with pytest.raises(grpc.RpcError) as streamed:
            list(stream(iter([raw]), timeout=30))
    for e in (unary, streamed):
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value
        assert "DecodeError" not in e.value.details() and "inference." not in e.value.details()
    assert "DecodeError" not in mesh.full_log("gateway-0")
