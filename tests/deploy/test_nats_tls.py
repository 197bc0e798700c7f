"""TLS to NATS: Dynamo's ``--nats-tls-*`` flags on real service processes against a nats-server that verifies clients.

One nats-server for the module runs ``--tls --tlsverify`` with a CA made for the module. A mocker worker given the
CA and a client certificate by flag registers, and a gateway given them by Dynamo's env names
(``NATS_TLS_*``) lists its model; a worker without the CA logs which flag is missing and never registers. The
in-process checks cover what the processes cannot show cheaply: a cleartext server is refused when TLS was asked
for, and bad flag values stop a process with one line and exit status 2.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import grpc
import pytest

from services.common import nats_connection, nats_tls
from services.launcher.plan import free_port
from services.launcher.processes import wait_port
from tests.conftest import require_module

pytestmark = [pytest.mark.deploy, pytest.mark.timeout(120)]

require_module("cryptography")
from tests.deploy.certs import TestCa  # noqa: E402 - after the dependency check

TLS_ENV = ("NATS_TLS_CA_CERT_PATH", "NATS_TLS_INSECURE", "NATS_TLS_CLIENT_CERT_PATH", "NATS_TLS_CLIENT_KEY_PATH")


def _env(**extra: str) -> dict[str, str]:
    """The test's environment without NATS TLS settings of its own (a developer's shell may have some)."""
    env = {k: v for k, v in os.environ.items() if k not in TLS_ENV}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


@pytest.fixture(scope="module")
def ca(tmp_path_factory):
    return TestCa(tmp_path_factory.mktemp("nats-tls"))


@pytest.fixture(scope="module")
def client_cert(ca):
    return ca.issue("service", ["meshfront-service"], client=True)


@pytest.fixture(scope="module")
def tls_nats(nats_bin, ca, tmp_path_factory):
    """A JetStream nats-server that speaks only TLS and requires a client certificate the CA signed."""
    server = ca.issue("nats", ["localhost", "127.0.0.1"])
    port = free_port()
    proc = subprocess.Popen([nats_bin, "-js", "-a", "127.0.0.1", "-p", str(port),
                             "-sd", str(tmp_path_factory.mktemp("nats-tls-js")), "--tls", "--tlscert", str(server.cert),
                             "--tlskey", str(server.key), "--tlscacert", str(ca.cert_path), "--tlsverify"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_port(port, time.monotonic() + 10), "nats-server did not start"
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def _start(argv: list[str], log: pathlib.Path, env: dict[str, str]) -> subprocess.Popen:
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", *argv], stdout=out, stderr=subprocess.STDOUT, env=env)


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
        raise


def _wait_for_line(log: pathlib.Path, text: str, proc: subprocess.Popen, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        content = log.read_text(errors="replace")
        if text in content:
            return content
        assert proc.poll() is None, f"exited {proc.returncode}:\n{content[-3000:]}"
        time.sleep(0.1)
    raise AssertionError(f"no {text!r} within {timeout} s:\n{log.read_text(errors='replace')[-3000:]}")


def _models(gateway_address: str) -> list[str]:
    from meshfront.gateway.v1 import gateway_pb2, gateway_pb2_grpc

    with grpc.insecure_channel(gateway_address) as channel:
        body = gateway_pb2_grpc.GatewayServiceStub(channel).ListModels(gateway_pb2.ListModelsRequest(), timeout=5)
    return [m["id"] for m in json.loads(body.data)["data"]]


def test_services_meet_over_tls_and_a_worker_without_the_ca_never_registers(tls_nats, ca, client_cert, tmp_path):
    flags = ["--nats-tls-ca-cert-path", str(ca.cert_path), "--nats-tls-client-cert-path", str(client_cert.cert),
             "--nats-tls-client-key-path", str(client_cert.key)]
    worker = ["services.workers.mocker", "--media", "image", "--port", "0", "--nats-url", tls_nats]
    gateway_port = free_port()
    gateway = _start(["services.gateway", "--port", str(gateway_port), "--nats-url", tls_nats],
                     tmp_path / "gateway.log", _env(NATS_TLS_CA_CERT_PATH=str(ca.cert_path),
                                                    NATS_TLS_CLIENT_CERT_PATH=str(client_cert.cert),
                                                    NATS_TLS_CLIENT_KEY_PATH=str(client_cert.key)))
    good = _start([*worker, "--model-name", "tls-image", *flags], tmp_path / "good.log", _env())
    # No CA: the system's roots do not know the test CA's server certificate.
    bad = _start([*worker, "--model-name", "untrusting-image", "--nats-tls-client-cert-path", str(client_cert.cert),
                  "--nats-tls-client-key-path", str(client_cert.key)], tmp_path / "bad.log", _env())
    try:
        _wait_for_line(tmp_path / "gateway.log", "READY", gateway, 60)
        deadline = time.monotonic() + 30
        while "tls-image" not in _models(f"127.0.0.1:{gateway_port}"):
            assert time.monotonic() < deadline, (tmp_path / "good.log").read_text()[-3000:]
            time.sleep(0.2)
        log = _wait_for_line(tmp_path / "bad.log", "--nats-tls-ca-cert-path", bad, 30)
        assert "CERTIFICATE_VERIFY_FAILED (unable to get local issuer certificate)" in log and "is not trusted" in log
        assert log.count("is not trusted") == 1  # nats-py retries every half second; the error is said once
        assert "untrusting-image" not in _models(f"127.0.0.1:{gateway_port}")
    finally:
        for proc in (bad, good, gateway):
            _stop(proc)


@pytest.mark.parametrize(("flags", "message"), [
    (["--nats-tls-client-cert-path", "{cert}"], "--nats-tls-client-cert-path and --nats-tls-client-key-path go"),
    (["--nats-tls-ca-cert-path", "{missing}"], "--nats-tls-ca-cert-path {missing}: cannot read it"),
    (["--nats-tls-ca-cert-path", "{key}"], "--nats-tls-ca-cert-path {key}: not a PEM certificate"),
])
def test_bad_nats_tls_flags_stop_the_process_with_one_line(client_cert, tmp_path, flags, message):
    names = {"cert": str(client_cert.cert), "key": str(client_cert.key), "missing": str(tmp_path / "missing.pem")}
    r = subprocess.run([sys.executable, "-m", "services.router", "--port", "0",
                        *[f.format(**names) for f in flags]], capture_output=True, text=True, timeout=60, env=_env())
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("meshfront router: "), r.stderr
    assert message.format(**names) in r.stderr


async def test_connections_speak_tls_with_the_process_context_and_refuse_a_cleartext_server(
        tls_nats, nats_url, ca, client_cert):
    context = nats_tls.context(nats_tls.NatsTls(nats_tls_ca_cert_path=str(ca.cert_path),
                                                nats_tls_client_cert_path=str(client_cert.cert),
                                                nats_tls_client_key_path=str(client_cert.key)))
    nats_connection.use_tls(context)
    try:
        nc = await nats_connection.connect(tls_nats, "tls-test")
        await nc.flush(timeout=5)  # a round trip over the verified connection
        await nats_connection.close_nats(nc)
        with pytest.raises(nats_connection.NatsTlsRefused, match="does not offer TLS"):
            await nats_connection.connect(nats_url, "cleartext-test")
    finally:
        nats_connection.use_tls(None)
    # A tls:// URL alone asks for TLS too.
    with pytest.raises(nats_connection.NatsTlsRefused):
        await nats_connection.connect(nats_url.replace("nats://", "tls://"), "cleartext-test")
