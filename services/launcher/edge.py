"""``meshfront run``'s edge flags: where Envoy listens (``--http-host``) and which clients it lets in
(``--tls-client-ca``: mTLS, Dynamo's ``--tls-client-ca-cert-path``).

Only Envoy's listener moves with ``--http-host``: the services behind it stay on loopback, and the launcher's
own readiness check dials the listener (loopback for a wildcard address).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import threading
import time
import urllib.request

WILDCARDS = ("0.0.0.0", "::")  # noqa: S104 - a wildcard listen address is what the user asked for


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--http-host", default="127.0.0.1",
                   help="the address Envoy's HTTP and gRPC listener binds: an IP address or a name this machine "
                        "resolves (0.0.0.0 for every interface); the services behind it stay on loopback")
    p.add_argument("--tls-client-ca", default="", metavar="FILE",
                   help="PEM CA: Envoy requires a client certificate it signed, for HTTP and gRPC alike (mTLS); "
                        "needs --tls-cert and --tls-key")


def check(args: argparse.Namespace) -> None:
    """``--http-host`` resolves; ``--tls-client-ca`` comes with the listener's certificate and is a readable PEM
    certificate (now, rather than when Envoy fails to load it). Raises ValueError naming the flag."""
    check_host(args.http_host)
    if not args.tls_client_ca:
        return
    if not args.tls_cert:
        raise ValueError("--tls-client-ca needs --tls-cert and --tls-key (the listener speaks TLS first)")
    try:
        with open(args.tls_client_ca, "rb") as f:
            pem = f.read()
    except OSError as e:
        raise ValueError(f"--tls-client-ca {args.tls_client_ca}: cannot read it ({e.strerror or e})") from None
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        raise ValueError(f"--tls-client-ca {args.tls_client_ca}: not a PEM certificate")
    args.tls_client_ca = os.path.abspath(args.tls_client_ca)


def check_host(host: str) -> None:
    """An IP address, or a name that resolves here (Envoy binds an address, so a name is resolved at start)."""
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        raise ValueError(f"--http-host {host!r} is neither an IP address nor a name this machine resolves ({e})") \
            from None


def listen_address(host: str) -> str:
    """What Envoy's listener binds for ``host``: an address as given, a name's first IPv4 address (Envoy's
    socket_address takes no names)."""
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        infos = socket.getaddrinfo(host, None, family=socket.AF_INET, type=socket.SOCK_STREAM)
        return str(infos[0][4][0])


def local_url(scheme: str, host: str, port: int) -> str:
    """The URL this machine reaches the listener at: the listen address, or loopback for a wildcard."""
    address = listen_address(host)
    if address in WILDCARDS:
        address = "127.0.0.1"
    if ":" in address:
        address = f"[{address}]"
    return f"{scheme}://{address}:{port}"


def announce_when_envoy_ready(url: str, admin_port: int, client_ca: str, stop: threading.Event,
                              timeout_s: float) -> None:
    """The URL, once Envoy's admin says it is live, for an edge that requires client certificates: the launcher
    has none to ask /health with, so it does not wait for the models as ``meshfront run`` otherwise does."""
    deadline = time.monotonic() + timeout_s
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/ready", timeout=1) as r:
                if r.status == 200:
                    print(f"\n  Meshfront is up: {url}/v1  (OpenAI API and KServe gRPC on this port; clients present "
                          f"a certificate signed by {client_ca})\n  Ctrl-C stops everything.\n", flush=True)
                    return
        except OSError:
            pass
        time.sleep(0.5)
