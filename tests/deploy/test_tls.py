"""TLS at the edge: Envoy terminates it for HTTP (openai SDK) and gRPC on one port.

Certificates come from a CA generated for this module; the mesh is the launcher's
own plan with ``tls_cert``/``tls_key`` set (what ``meshfront run --tls-cert/--tls-key``
starts), in the all-in-one shape to keep the process count small.
"""

from __future__ import annotations

import json
import pathlib
import ssl
import subprocess

import grpc
import httpx
import pytest
import yaml

from services.launcher.envoy_config import render
from services.launcher.plan import WorkerSpec, ephemeral_plan
from services.launcher.processes import Mesh
from tests.conftest import MOCKER_SCRIPT, ROOT, require_module, stop_cleanly

pytestmark = pytest.mark.deploy

require_module("cryptography")
from tests.deploy.certs import TestCa  # noqa: E402 - after the dependency check

MODEL = "meshfront/demo-qwen"


class TlsMesh(Mesh):
    """The launcher's mesh, addressed over https with the test CA."""

    def __init__(self, plan, log_dir, ca_path):
        super().__init__(plan, log_dir)
        self.ca_path = str(ca_path)

    def trust(self) -> ssl.SSLContext:
        """A client context that trusts only the test CA (what a deployment's clients configure)."""
        return ssl.create_default_context(cafile=self.ca_path)

    @property
    def url(self) -> str:
        return f"https://localhost:{self.plan.http_port}"

    def ssl_context(self) -> ssl.SSLContext:
        return self.trust()


@pytest.fixture(scope="module")
def ca(tmp_path_factory):
    return TestCa(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def server_cert(ca):
    return ca.issue("edge", ["localhost", "127.0.0.1"])


@pytest.fixture(scope="module")
def tls_mesh(tmp_path_factory, ca, server_cert, demo_model_dir, envoy_bin, nats_bin):
    worker = WorkerSpec(str(demo_model_dir), MODEL, "mocker", ("--script", str(MOCKER_SCRIPT),
                                                              "--speedup-ratio", "0"))
    plan = ephemeral_plan([worker], inproc=True, run_dir=ROOT / ".run" / "tests",
                          tls_cert=str(server_cert.cert), tls_key=str(server_cert.key))
    mesh = TlsMesh(plan, tmp_path_factory.mktemp("tls-mesh-logs"), ca.cert_path)
    mesh.start(timeout=60)
    yield mesh
    stop_cleanly(mesh)


def test_tls_render_validates(envoy_bin, server_cert, tmp_path):
    path = tmp_path / "envoy-tls.yaml"
    path.write_text(render(listen_host="127.0.0.1", listen_port=18443, admin_port=18444,
                           gateways=[("127.0.0.1", 19100)], tls=(str(server_cert.cert), str(server_cert.key))))
    chain = yaml.safe_load(path.read_text())["static_resources"]["listeners"][0]["filter_chains"][0]
    context = chain["transport_socket"]["typed_config"]["common_tls_context"]
    assert context["alpn_protocols"] == ["h2", "http/1.1"]
    r = subprocess.run([envoy_bin, "--mode", "validate", "-c", str(path)], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]


def test_openai_sdk_over_https(tls_mesh):
    import openai

    with httpx.Client(verify=tls_mesh.trust(), timeout=30) as http:
        client = openai.OpenAI(base_url=f"{tls_mesh.url}/v1", api_key="unused", max_retries=0, http_client=http)
        reply = client.chat.completions.create(model=MODEL, max_tokens=8,
                                               messages=[{"role": "user", "content": "Hello"}])
        assert reply.choices[0].message.content
        assert reply.usage.completion_tokens > 0
        chunks = list(client.chat.completions.create(model=MODEL, max_tokens=8, stream=True,
                                                     messages=[{"role": "user", "content": "Hello"}]))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
            reply.choices[0].message.content


def test_http2_is_negotiated_by_alpn(tls_mesh):
    with httpx.Client(verify=tls_mesh.trust(), http2=True, timeout=10) as http:
        r = http.get(f"{tls_mesh.url}/v1/models")
    assert r.status_code == 200 and r.http_version == "HTTP/2"
    assert [m["id"] for m in r.json()["data"]] == [MODEL]


def test_untrusted_and_cleartext_clients_are_refused(tls_mesh):
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{tls_mesh.url}/v1/models", timeout=5)  # system CAs do not know ours
    with pytest.raises(httpx.HTTPError):  # cleartext HTTP to a TLS listener gets no HTTP answer
        httpx.get(f"http://127.0.0.1:{tls_mesh.plan.http_port}/v1/models", timeout=5)


def test_grpc_over_tls_through_envoy(tls_mesh):
    from meshfront.gateway.v1 import gateway_pb2, gateway_pb2_grpc

    credentials = grpc.ssl_channel_credentials(root_certificates=pathlib.Path(tls_mesh.ca_path).read_bytes())
    with grpc.secure_channel(f"localhost:{tls_mesh.plan.http_port}", credentials) as channel:
        stub = gateway_pb2_grpc.GatewayServiceStub(channel)
        body = stub.ListModels(gateway_pb2.ListModelsRequest(), timeout=10)
    assert [m["id"] for m in json.loads(body.data)["data"]] == [MODEL]


def test_grpc_without_the_ca_fails_the_handshake(tls_mesh):
    from meshfront.gateway.v1 import gateway_pb2, gateway_pb2_grpc

    address = f"localhost:{tls_mesh.plan.http_port}"
    with grpc.secure_channel(address, grpc.ssl_channel_credentials()) as channel, \
            pytest.raises(grpc.RpcError) as err:
        gateway_pb2_grpc.GatewayServiceStub(channel).ListModels(gateway_pb2.ListModelsRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_meshfront_run_rejects_half_a_tls_pair(tmp_path, server_cert):
    from services.launcher.run import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--tls-cert", str(server_cert.cert)])
    with pytest.raises(SystemExit):
        parse_args(["--tls-cert", str(server_cert.cert), "--tls-key", str(tmp_path / "missing.key")])
    args = parse_args(["--tls-cert", str(server_cert.cert), "--tls-key", str(server_cert.key)])
    assert args.tls_cert and args.tls_key


def test_tritonclient_over_tls(tls_mesh):
    """KServe v2 clients reach the gateway through Envoy's TLS listener with ssl=True."""
    require_module("tritonclient")
    import tritonclient.grpc as triton

    client = triton.InferenceServerClient(f"localhost:{tls_mesh.plan.http_port}", ssl=True,
                                          root_certificates=tls_mesh.ca_path)
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready(MODEL)
        assert client.get_model_metadata(MODEL, as_json=True)["name"] == MODEL
    finally:
        client.close()
