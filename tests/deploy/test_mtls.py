"""Mutual TLS between services: the whole split mesh (Envoy -> gateway -> preprocessor, two router
replicas, postprocessor -> worker) with ``--tls-ca/--tls-cert/--tls-key`` on every process.

Every service gets its own certificate from a CA generated for this module (the launcher's
``MeshPlan.mtls``/``mtls_certs``); Envoy presents its own to the gateway. An openai SDK call
through Envoy proves every hop handshakes; the negative checks prove a service port refuses
cleartext, a TLS client without a certificate, and a certificate from another CA.
"""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.launcher.plan import WorkerSpec, ephemeral_plan
from services.launcher.processes import Mesh
from tests.conftest import MOCKER_SCRIPT, ROOT, require_module, sdk_client, stop_cleanly

pytestmark = pytest.mark.deploy

require_module("cryptography")
from tests.deploy.certs import TestCa  # noqa: E402 - after the dependency check

MODEL = "meshfront/demo-qwen"
HOSTS = ["localhost", "127.0.0.1"]


@pytest.fixture(scope="module")
def ca(tmp_path_factory):
    return TestCa(tmp_path_factory.mktemp("mtls"))


@pytest.fixture(scope="module")
def mtls_mesh(tmp_path_factory, ca, demo_model_dir, envoy_bin, nats_bin):
    worker = WorkerSpec(str(demo_model_dir), MODEL, "mocker", ("--script", str(MOCKER_SCRIPT),
                                                              "--speedup-ratio", "0"))
    plan = ephemeral_plan([worker], run_dir=ROOT / ".run" / "tests", metrics_ports={}, routers=2)
    names = [*plan.service_names(), "envoy"]
    leaves = {name: ca.issue(name, HOSTS, client=True) for name in names}
    plan.mtls_certs = {name: (str(leaf.cert), str(leaf.key)) for name, leaf in leaves.items()}
    shared = leaves["gateway-0"]
    plan.mtls = (str(ca.cert_path), str(shared.cert), str(shared.key))
    mesh = Mesh(plan, tmp_path_factory.mktemp("mtls-mesh-logs"))
    mesh.start(timeout=60)
    yield mesh
    stop_cleanly(mesh)


def test_openai_sdk_through_envoy_over_mtls_hops(mtls_mesh):
    with sdk_client(mtls_mesh, timeout=20) as client:
        out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=8)
        assert out.choices[0].message.content
        assert out.usage.completion_tokens > 0
        stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=8, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text


def _health(channel: grpc.Channel) -> int:
    with channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=3).status


def _service_ports(mesh: Mesh) -> dict[str, int]:
    p = mesh.plan
    return {"gateway-0": p.gateway_ports[0], "preprocessor": p.preprocessor_port, "router": p.router_ports[0],
            "router-1": p.router_ports[1],
            "postprocessor": p.postprocessor_port, "mocker-0": p.worker_ports[0]}


def test_service_ports_answer_a_client_with_a_mesh_certificate(mtls_mesh, ca):
    leaf = ca.issue("probe", HOSTS, client=True)
    creds = grpc.ssl_channel_credentials(ca.cert_path.read_bytes(), leaf.key.read_bytes(), leaf.cert.read_bytes())
    for name, port in _service_ports(mtls_mesh).items():
        status = _health(grpc.secure_channel(f"127.0.0.1:{port}", creds))
        assert status == health_pb2.HealthCheckResponse.SERVING, name


@pytest.mark.parametrize("client", ["cleartext", "no-client-cert", "foreign-ca-cert"])
def test_service_ports_refuse_unauthenticated_clients(mtls_mesh, ca, tmp_path, client):
    if client == "cleartext":
        creds = None
    elif client == "no-client-cert":
        creds = grpc.ssl_channel_credentials(ca.cert_path.read_bytes())
    else:
        stranger = TestCa(tmp_path / "stranger").issue("stranger", HOSTS, client=True)
        creds = grpc.ssl_channel_credentials(ca.cert_path.read_bytes(), stranger.key.read_bytes(),
                                             stranger.cert.read_bytes())
    for name, port in _service_ports(mtls_mesh).items():
        target = f"127.0.0.1:{port}"
        channel = grpc.insecure_channel(target) if creds is None else grpc.secure_channel(target, creds)
        with pytest.raises(grpc.RpcError) as refused:
            _health(channel)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, name


def test_meshfront_run_takes_the_mesh_tls_flags_together(ca):
    from services.launcher.run import parse_args

    leaf = ca.issue("run", HOSTS, client=True)
    with pytest.raises(SystemExit):
        parse_args(["--mesh-tls-ca", str(ca.cert_path), "--mesh-tls-cert", str(leaf.cert)])
    args = parse_args(["--mesh-tls-ca", str(ca.cert_path), "--mesh-tls-cert", str(leaf.cert),
                       "--mesh-tls-key", str(leaf.key)])
    assert args.mtls == (str(ca.cert_path), str(leaf.cert), str(leaf.key))
    assert parse_args([]).mtls is None
