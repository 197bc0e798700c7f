"""mTLS at the edge: Envoy requires a client certificate signed by ``tls_client_ca`` (Dynamo's
``--tls-client-ca-cert-path``; ``meshfront run --tls-client-ca``) on its one port, HTTP and gRPC alike; and
``--http-host``, the address that listener binds.

The mesh is the launcher's own plan (what ``meshfront run --tls-cert --tls-key --tls-client-ca`` starts), in the
all-in-one shape to keep the process count small. Certificates come from CAs made for this module: the edge's,
which signs the server's and the good client's, and another that signs a client Envoy must refuse.
"""

from __future__ import annotations

import json
import pathlib
import socket
import ssl
import subprocess
import time

import grpc
import httpx
import pytest
import yaml

from services.launcher.envoy_config import render
from services.launcher.plan import WorkerSpec, ephemeral_plan, specs
from services.launcher.processes import Mesh
from tests.conftest import MOCKER_SCRIPT, ROOT, require_module, stop_cleanly

pytestmark = pytest.mark.deploy

require_module("cryptography")
from tests.deploy.certs import Leaf, TestCa  # noqa: E402 - after the dependency check

MODEL = "meshfront/demo-qwen"


@pytest.fixture(scope="module")
def ca(tmp_path_factory):
    return TestCa(tmp_path_factory.mktemp("edge-ca"))


@pytest.fixture(scope="module")
def server_cert(ca):
    return ca.issue("edge", ["localhost", "127.0.0.1"])


@pytest.fixture(scope="module")
def client_cert(ca):
    return ca.issue("client", ["meshfront-client"], client=True)


@pytest.fixture(scope="module")
def rogue_cert(tmp_path_factory):
    """A client certificate from a CA the edge does not know."""
    return TestCa(tmp_path_factory.mktemp("rogue-ca"), name="rogue CA").issue("rogue", ["rogue"], client=True)


def client_context(ca: TestCa, leaf: Leaf | None) -> ssl.SSLContext:
    """Trusts the edge's CA; presents ``leaf`` when given."""
    context = ssl.create_default_context(cafile=str(ca.cert_path))
    if leaf is not None:
        context.load_cert_chain(str(leaf.cert), str(leaf.key))
    return context


class MtlsMesh(Mesh):
    """The launcher's mesh, addressed over https with a client certificate (its readiness checks too)."""

    def __init__(self, plan, log_dir, ca: TestCa, client: Leaf):
        super().__init__(plan, log_dir)
        self.ca, self.client = ca, client

    @property
    def url(self) -> str:
        return f"https://localhost:{self.plan.http_port}"

    def ssl_context(self) -> ssl.SSLContext:
        return client_context(self.ca, self.client)


@pytest.fixture(scope="module")
def mtls_mesh(tmp_path_factory, ca, server_cert, client_cert, demo_model_dir, envoy_bin, nats_bin):
    worker = WorkerSpec(str(demo_model_dir), MODEL, "mocker", ("--script", str(MOCKER_SCRIPT),
                                                              "--speedup-ratio", "0"))
    plan = ephemeral_plan([worker], inproc=True, run_dir=ROOT / ".run" / "tests", tls_cert=str(server_cert.cert),
                          tls_key=str(server_cert.key), tls_client_ca=str(ca.cert_path))
    mesh = MtlsMesh(plan, tmp_path_factory.mktemp("mtls-mesh-logs"), ca, client_cert)
    mesh.start(timeout=60)
    yield mesh
    stop_cleanly(mesh)


def test_render_requires_a_client_certificate_and_validates(envoy_bin, ca, server_cert, tmp_path):
    path = tmp_path / "envoy-mtls.yaml"
    path.write_text(render(listen_host="127.0.0.1", listen_port=18443, admin_port=18444,
                           gateways=[("127.0.0.1", 19100)], tls=(str(server_cert.cert), str(server_cert.key)),
                           tls_client_ca=str(ca.cert_path)))
    socket_config = yaml.safe_load(path.read_text())["static_resources"]["listeners"][0]["filter_chains"][0][
        "transport_socket"]["typed_config"]
    assert socket_config["require_client_certificate"] is True
    assert socket_config["common_tls_context"]["validation_context"] == {"trusted_ca": {"filename": str(ca.cert_path)}}
    r = subprocess.run([envoy_bin, "--mode", "validate", "-c", str(path)], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    with pytest.raises(ValueError, match="client CA needs"):
        render(listen_host="127.0.0.1", listen_port=1, admin_port=2, gateways=[], tls_client_ca=str(ca.cert_path))


def test_the_right_client_certificate_gets_the_openai_api(mtls_mesh, ca, client_cert):
    import openai

    with httpx.Client(verify=client_context(ca, client_cert), timeout=30) as http:
        assert http.get(f"{mtls_mesh.url}/v1/models").status_code == 200
        client = openai.OpenAI(base_url=f"{mtls_mesh.url}/v1", api_key="unused", max_retries=0, http_client=http)
        assert [m.id for m in client.models.list()] == [MODEL]
        chunks = list(client.chat.completions.create(model=MODEL, max_tokens=8, stream=True,
                                                     messages=[{"role": "user", "content": "Hello"}]))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


@pytest.mark.parametrize("leaf", ["none", "rogue"])
def test_a_client_without_a_certificate_the_ca_signed_is_refused_in_the_handshake(mtls_mesh, ca, rogue_cert, leaf):
    context = client_context(ca, rogue_cert if leaf == "rogue" else None)
    alert = "CERTIFICATE_REQUIRED" if leaf == "none" else "UNKNOWN_CA"
    # TLS 1.3: the server judges the client's certificate after the client's handshake finished; its alert is
    # what the first read gets, so no HTTP answer ever comes.
    with pytest.raises(httpx.HTTPError, match=alert):
        httpx.get(f"{mtls_mesh.url}/v1/models", verify=context, timeout=5)


def test_kserve_grpc_with_and_without_a_client_certificate(mtls_mesh, ca, client_cert):
    require_module("tritonclient")
    import tritonclient.grpc as triton
    from tritonclient.utils import InferenceServerException

    address = f"localhost:{mtls_mesh.plan.http_port}"
    client = triton.InferenceServerClient(address, ssl=True, root_certificates=str(ca.cert_path),
                                          private_key=str(client_cert.key), certificate_chain=str(client_cert.cert))
    try:
        assert client.is_server_ready() and client.is_model_ready(MODEL)
        assert client.get_model_metadata(MODEL, as_json=True)["name"] == MODEL
    finally:
        client.close()
    anonymous = triton.InferenceServerClient(address, ssl=True, root_certificates=str(ca.cert_path))
    try:
        with pytest.raises(InferenceServerException, match="StatusCode.UNAVAILABLE"):
            anonymous.is_server_ready()
    finally:
        anonymous.close()


def test_grpc_gateway_service_with_a_client_certificate(mtls_mesh, ca, client_cert):
    from meshfront.gateway.v1 import gateway_pb2, gateway_pb2_grpc

    credentials = grpc.ssl_channel_credentials(root_certificates=pathlib.Path(ca.cert_path).read_bytes(),
                                               private_key=client_cert.key.read_bytes(),
                                               certificate_chain=client_cert.cert.read_bytes())
    with grpc.secure_channel(f"localhost:{mtls_mesh.plan.http_port}", credentials) as channel:
        body = gateway_pb2_grpc.GatewayServiceStub(channel).ListModels(gateway_pb2.ListModelsRequest(), timeout=10)
    assert [m["id"] for m in json.loads(body.data)["data"]] == [MODEL]


def test_meshfront_run_checks_the_edge_flags(ca, server_cert, tmp_path, capsys):
    from services.launcher.run import parse_args

    pair = ["--tls-cert", str(server_cert.cert), "--tls-key", str(server_cert.key)]
    for argv, message in [
        (["--tls-client-ca", str(ca.cert_path)], "--tls-client-ca needs --tls-cert and --tls-key"),
        ([*pair, "--tls-client-ca", str(tmp_path / "missing.pem")], "cannot read it (No such file or directory)"),
        ([*pair, "--tls-client-ca", str(server_cert.key)], "not a PEM certificate"),
        (["--http-host", "no-such-host.invalid"], "--http-host 'no-such-host.invalid' is neither an IP address"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            parse_args(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and message in err.splitlines()[-1], err
    args = parse_args([*pair, "--tls-client-ca", str(ca.cert_path), "--http-host", "localhost"])
    assert args.tls_client_ca == str(ca.cert_path) and args.http_host == "localhost"


def test_http_host_is_the_address_envoy_binds(envoy_bin, tmp_path):
    """The plan's Envoy (what ``meshfront run --http-host 127.0.0.2`` starts), alone: it listens on that address
    and not on 127.0.0.1."""
    from services.launcher.edge import listen_address, local_url
    from services.launcher.processes import wait_port

    assert listen_address("localhost") == "127.0.0.1" and local_url("http", "0.0.0.0", 80) == "http://127.0.0.1:80"
    plan = ephemeral_plan([], http_host="127.0.0.2", run_dir=tmp_path)
    envoy = next(s for s in specs(plan) if s.name == "envoy")
    proc = subprocess.Popen(envoy.argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=envoy.env)
    try:
        assert wait_port(plan.admin_port, time.monotonic() + 30), "Envoy did not start"
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.2", plan.http_port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "Envoy does not listen on 127.0.0.2"
                time.sleep(0.1)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", plan.http_port), timeout=1)
    finally:
        proc.terminate()
        proc.wait(10)
