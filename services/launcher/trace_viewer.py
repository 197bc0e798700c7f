"""``meshfront run --trace``: Arize Phoenix as the local trace viewer, and every process pointed at it.

Phoenix runs from its own environment (``.venv-phoenix``, services/launcher/engine_env.py), supervised
like the mesh's processes, with its data under the run directory. It takes OTLP/gRPC on one port (the
mesh's processes and Envoy send there: MeshPlan.otlp_endpoint) and serves its UI and REST API on another,
which ``meshfront trace REQUEST_ID`` reads (services/launcher/trace_cli.py).
"""

from __future__ import annotations

import pathlib
import threading
import time
import urllib.request

from services.launcher.engine_env import BASE_LINK, PHOENIX
from services.launcher.plan import ProcessSpec

UI_PORT, OTLP_PORT = 6006, 4317


def phoenix_spec(run_dir: pathlib.Path, ui_port: int = UI_PORT, otlp_port: int = OTLP_PORT) -> ProcessSpec:
    """Phoenix on loopback; its SQLite store under ``run_dir``."""
    work = run_dir / f"phoenix-{ui_port}"
    work.mkdir(parents=True, exist_ok=True)
    # Phoenix's own script, from the environment's base: it needs nothing of this checkout.
    return ProcessSpec("phoenix", [str(PHOENIX.venv / BASE_LINK / "bin" / "phoenix"), "serve"], ui_port, {
        "PHOENIX_HOST": "127.0.0.1", "PHOENIX_PORT": str(ui_port), "PHOENIX_GRPC_PORT": str(otlp_port),
        "PHOENIX_WORKING_DIR": str(work), "PHOENIX_TELEMETRY_ENABLED": "false", "PYTHONUNBUFFERED": "1"})


def otlp_endpoint(otlp_port: int = OTLP_PORT) -> str:
    return f"http://127.0.0.1:{otlp_port}"


def is_up(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/v1/projects", timeout=1) as r:  # noqa: S310 - our own loopback
            return r.status == 200
    except OSError:
        return False


def announce_when_up(url: str, stop: threading.Event, timeout_s: float = 900.0) -> None:
    """Prints the viewer's URL once its API answers (Phoenix takes a few seconds to start)."""
    deadline = time.monotonic() + timeout_s
    while not stop.is_set() and time.monotonic() < deadline:
        if is_up(url):
            print(f"\n  Traces: {url}  (Arize Phoenix; every response's x-request-id finds its trace:\n"
                  f"  meshfront trace REQUEST_ID --url {url})\n", flush=True)
            return
        time.sleep(0.5)
