"""The shipped Envoy config validates, renders for any ports, and boots with OpenAI- or Anthropic-shaped errors."""

from __future__ import annotations

import subprocess

import httpx
import pytest
import yaml

from services.launcher.envoy_config import ENVOY_YAML, render
from services.launcher.plan import free_port
from tests.conftest import ROOT
from services.launcher.processes import wait_port

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
