"""Optional (m)TLS between services: the one place that turns flags into gRPC credentials.

Off by default (cleartext on a trusted network or inside a service mesh that does it for us).
``--tls-cert``/``--tls-key`` make a service's port speak TLS and give its outgoing channels a
client certificate; ``--tls-ca`` additionally makes the port *require* a client certificate signed
by that CA and makes the channels trust only that CA, which is mutual TLS across the mesh. Every
service is both a server and a client, so one certificate (serverAuth + clientAuth) per service
serves both roles. The PEM files are read once at startup: rotating them means restarting the pod,
which a Kubernetes rollout does anyway.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from services.common.targets import address_host, split_target


@dataclasses.dataclass(frozen=True)
class MeshTls:
    """PEM bytes of this service's certificate chain and key, and of the CA it trusts (if any)."""

    cert: bytes
    key: bytes
    ca: bytes | None = None

    @property
    def mutual(self) -> bool:
        return self.ca is not None


def load(cert: str, key: str, ca: str = "") -> MeshTls | None:
    """The service's TLS material from file paths; None when TLS is off (no certificate given)."""
    if not cert and not key:
        if ca:
            raise ValueError("--tls-ca needs --tls-cert and --tls-key (every service is also a server)")
        return None
    if not (cert and key):
        raise ValueError("--tls-cert and --tls-key go together")
    return MeshTls(cert=Path(cert).read_bytes(), key=Path(key).read_bytes(),
                   ca=Path(ca).read_bytes() if ca else None)


def from_config(cfg: Any) -> MeshTls | None:
    """``load`` from a service config carrying the common ``tls_cert``/``tls_key``/``tls_ca`` flags."""
    return load(cfg.tls_cert, cfg.tls_key, cfg.tls_ca)


def server_credentials(tls: MeshTls) -> grpc.ServerCredentials:
    """TLS for a listening port; with a CA, a client without a certificate it signed is refused."""
    return grpc.ssl_server_credentials([(tls.key, tls.cert)], root_certificates=tls.ca,
                                       require_client_auth=tls.mutual)


def add_port(server: grpc.aio.Server, address: str, tls: MeshTls | None) -> int:
    """Binds ``address`` in cleartext or TLS; returns the bound port."""
    if tls is None:
        return server.add_insecure_port(address)
    return server.add_secure_port(address, server_credentials(tls))


def channel(target: str, options: Sequence[tuple[str, Any]], tls: MeshTls | None) -> grpc.aio.Channel:
    """A channel to another service: cleartext, or TLS presenting this service's certificate.

    Without a CA the server is checked against the system's roots. The server's certificate must
    name the host in ``target`` (an IP SAN for addresses such as 127.0.0.1). A replica list
    (``ipv4:a:1,b:2``) has no single authority, so every replica is checked against the first
    one's host: fine on one machine; across hosts use a ``dns:///`` name or certificates that share it.
    """
    if tls is None:
        return grpc.aio.insecure_channel(target, options=options)
    creds = grpc.ssl_channel_credentials(root_certificates=tls.ca, private_key=tls.key, certificate_chain=tls.cert)
    name = _list_target_host(target)
    if name:
        options = [*options, ("grpc.ssl_target_name_override", name)]
    return grpc.aio.secure_channel(target, creds, options=options)


def _list_target_host(target: str) -> str:
    """The first address's host of an ``ipv4:``/``ipv6:`` list target; empty for any other target."""
    if not target.startswith(("ipv4:", "ipv6:")) or "," not in target:
        return ""
    return address_host(split_target(target)[0][0])
