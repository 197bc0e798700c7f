"""``meshfront run``'s banner: the URL, printed once the mesh serves what it was asked to serve.

Once ``/health`` answers 200 and lists every model the plan's workers serve (the embedding worker loads torch and
its weights long after the mocker workers registered), or, where Envoy requires client certificates, once Envoy
is live (the launcher has no certificate to ask ``/health`` with).
"""

from __future__ import annotations

import json
import ssl
import threading
import time
import urllib.request

from services.launcher import edge
from services.launcher.plan import MeshPlan


def when_serving(url: str, stop: threading.Event, timeout_s: float, models: frozenset[str] = frozenset(),
                 nats_url: str = "", auth: bool = False) -> None:
    """Prints the banner once /health answers 200 and lists every model in ``models``."""
    deadline = time.monotonic() + timeout_s
    # Our own listener: with TLS the certificate may be self-signed, and this only asks "is it up".
    context = ssl._create_unverified_context() if url.startswith("https") else None  # noqa: S323
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1, context=context) as r:  # noqa: S310 - ours
                if r.status == 200 and models <= set(json.loads(r.read()).get("models", {})):
                    print(banner(url, nats_url, auth), flush=True)
                    return
        except (OSError, ValueError):
            pass
        time.sleep(0.5)


def banner(url: str, nats_url: str = "", auth: bool = False) -> str:
    key = ' -H "Authorization: Bearer $KEY"' if auth else ""
    where = f" --nats-url {nats_url}" if nats_url else ""
    keys = f"  keys: meshfront keys create --tenant NAME{where} (prints one)\n" if auth else ""
    frontend = f"  another frontend: meshfront frontend --nats-url {nats_url}\n" if nats_url else ""
    return (f"\n  Meshfront is up: {url}/v1  (OpenAI API and KServe gRPC on this port)\n"
            f"  try: curl{key} {url}/v1/models\n{keys}{frontend}  Ctrl-C stops everything.\n")


def start(plan: MeshPlan, http_port: int, timeout_s: float, stop: threading.Event, auth: bool = False) -> None:
    """The banner's thread: when the mesh serves, or when Envoy is live where it requires client certificates."""
    url = edge.local_url("https" if plan.tls else "http", plan.http_host, http_port)
    if plan.tls_client_ca:
        thread = threading.Thread(target=edge.announce_when_envoy_ready, daemon=True,
                                  args=(url, plan.admin_port, plan.tls_client_ca, stop, timeout_s))
    else:
        thread = threading.Thread(target=when_serving, daemon=True, args=(
            # an attached engine's model may go unnamed (its own name): no name to wait for
            url, stop, timeout_s, frozenset(w.model_name for w in plan.workers if w.model_name), plan.nats_url, auth))
    thread.start()
