"""The ``--nats-tls-*`` flags: Dynamo's env names, what turns TLS on, and the context they make."""

from __future__ import annotations

import ssl

import pytest

from services.common import nats_tls
from services.router.config import parse_config as router_config

pytestmark = pytest.mark.unit


def test_off_without_flags_or_env():
    flags = nats_tls.from_argv(["--port", "0", "--nats-url", "nats://n:4222"], env={})
    assert not flags.on and nats_tls.context(flags) is None


def test_dynamo_env_names_and_the_flag_winning_over_them():
    env = {"NATS_TLS_CA_CERT_PATH": "/env/ca.pem", "NATS_TLS_INSECURE": "1",
           "NATS_TLS_CLIENT_CERT_PATH": "/env/c.pem", "NATS_TLS_CLIENT_KEY_PATH": "/env/k.pem"}
    assert nats_tls.from_argv([], env=env) == nats_tls.NatsTls("/env/ca.pem", True, "/env/c.pem", "/env/k.pem")
    flags = nats_tls.from_argv(["--nats-tls-ca-cert-path=/flag/ca.pem", "--no-nats-tls-insecure"], env=env)
    assert (flags.nats_tls_ca_cert_path, flags.nats_tls_insecure) == ("/flag/ca.pem", False)


def test_every_service_accepts_the_flags(capsys):
    """They are common flags: a service's own parser takes them (the router's, here) and shows Dynamo's env name."""
    assert router_config(["--nats-tls-ca-cert-path", "/ca.pem", "--nats-tls-insecure"], env={}).port
    with pytest.raises(SystemExit):
        router_config(["--help"], env={})
    usage = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "--nats-tls-client-key-path" in usage and "[env NATS_TLS_INSECURE; default False]" in usage


def test_insecure_alone_turns_tls_on_without_verification():
    ctx = nats_tls.context(nats_tls.NatsTls(nats_tls_insecure=True))
    assert ctx is not None and ctx.verify_mode == ssl.CERT_NONE and not ctx.check_hostname


def test_a_ca_is_the_only_trust(tmp_path):
    from tests.deploy.certs import TestCa

    ca = TestCa(tmp_path)
    ctx = nats_tls.context(nats_tls.NatsTls(nats_tls_ca_cert_path=str(ca.cert_path)))
    assert ctx is not None and ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert [c["subject"] for c in ctx.get_ca_certs()] == [((("commonName", "meshfront test CA"),),)]


@pytest.mark.parametrize(("flags", "message"), [
    (nats_tls.NatsTls(nats_tls_client_key_path="k.pem"), "go together"),
    (nats_tls.NatsTls(nats_tls_client_cert_path="/nope/c.pem", nats_tls_client_key_path="/nope/k.pem"),
     "--nats-tls-client-cert-path /nope/c.pem: cannot read it (No such file or directory)"),
])
def test_bad_client_certificate_flags(flags, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        nats_tls.context(flags)


def test_a_key_that_is_not_the_certificates(tmp_path):
    from tests.deploy.certs import TestCa

    ca = TestCa(tmp_path)
    one, other = ca.issue("one", ["a"], client=True), ca.issue("other", ["b"], client=True)
    with pytest.raises(ValueError, match="not a PEM certificate and its private key"):
        nats_tls.context(nats_tls.NatsTls(nats_tls_client_cert_path=str(one.cert),
                                          nats_tls_client_key_path=str(other.key)))
