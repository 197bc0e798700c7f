"""TLS on a process's NATS connections: Dynamo's ``--nats-tls-*`` flags made into one ``ssl.SSLContext``.

The flags (``flags.add_nats_tls_flags``, part of every service's common flags) keep Dynamo's names and env twins
(``NATS_TLS_CA_CERT_PATH``, ``NATS_TLS_INSECURE``, ``NATS_TLS_CLIENT_CERT_PATH``, ``NATS_TLS_CLIENT_KEY_PATH``:
not ``DYN_``-prefixed, as in Dynamo), so one pod spec's env configures a Dynamo frontend and every Meshfront
process alike. Any of them turns TLS on; so does a ``tls://`` server URL (services/common/nats_connection.py
refuses a server that then answers in cleartext).

- ``--nats-tls-ca-cert-path``: the only CA the server's certificate is checked against (without it: the
  system's roots).
- ``--nats-tls-client-cert-path`` / ``--nats-tls-client-key-path``: the certificate presented to a server that
  verifies clients (nats-server ``--tlsverify``); one without the other is a bad value.
- ``--nats-tls-insecure``: no check of the server's certificate at all (local development only).

The files are read once at process start, like the gRPC certificates (services/common/tls.py): an unreadable
one is a bad value there (one line, exit 2), not a connection that fails later in a retry loop.
"""

from __future__ import annotations

import dataclasses
import os
import ssl
from collections.abc import Mapping, Sequence

from services.common.flags import FlagParser, add_nats_tls_flags


@dataclasses.dataclass(frozen=True)
class NatsTls:
    """The four flags' values (paths as given; empty: not given)."""

    nats_tls_ca_cert_path: str = ""
    nats_tls_insecure: bool = False
    nats_tls_client_cert_path: str = ""
    nats_tls_client_key_path: str = ""

    @property
    def on(self) -> bool:
        return bool(self.nats_tls_ca_cert_path or self.nats_tls_insecure or self.nats_tls_client_cert_path
                    or self.nats_tls_client_key_path)


def from_argv(argv: Sequence[str], env: Mapping[str, str] | None = None) -> NatsTls:
    """The flags' values in a process's ``argv`` (and env), beside the service's own config.

    The service's parser has already accepted these flags (``add_common_flags`` offers them); reading them
    again here, from the same argv, keeps the process's one NATS identity out of the half-dozen service
    configs, none of which uses it: only the process start does, once (``nats_connection.use_tls``)."""
    p = FlagParser("nats-tls", "NATS TLS", os.environ if env is None else env)
    add_nats_tls_flags(p)
    args, _ = p.parse_known(list(argv))
    values = vars(args)
    return NatsTls(**{f.name: values[f.name] for f in dataclasses.fields(NatsTls)})


def context(flags: NatsTls) -> ssl.SSLContext | None:
    """The client context every NATS connection of the process uses; None when no flag turns TLS on.

    Raises:
        ValueError: a client certificate without its key (or the reverse), or a file that cannot be read
            or is not PEM of the right kind, named with its flag."""
    if not flags.on:
        return None
    cert, key = flags.nats_tls_client_cert_path, flags.nats_tls_client_key_path
    if bool(cert) != bool(key):
        raise ValueError("--nats-tls-client-cert-path and --nats-tls-client-key-path go together")
    ca = flags.nats_tls_ca_cert_path
    # cadata, not cafile: a missing file's OSError would not name the path. With a CA, only it is trusted.
    try:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=_ca_pem(ca) if ca else None)
    except ssl.SSLError as e:
        raise ValueError(f"--nats-tls-ca-cert-path {ca}: not a PEM certificate ({e.reason or e})") from None
    if cert:
        _read("--nats-tls-client-cert-path", cert)
        _read("--nats-tls-client-key-path", key)
        try:
            ctx.load_cert_chain(cert, key)
        except ssl.SSLError as e:
            raise ValueError(f"--nats-tls-client-cert-path {cert} and --nats-tls-client-key-path {key}: not a PEM "
                             f"certificate and its private key ({e.reason or e})") from None
    if flags.nats_tls_insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _read(flag: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"{flag} {path}: cannot read it ({e.strerror or e})") from None


def _ca_pem(path: str) -> str:
    text = _read("--nats-tls-ca-cert-path", path).decode("ascii", errors="replace")
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise ValueError(f"--nats-tls-ca-cert-path {path}: not a PEM certificate")
    return text
