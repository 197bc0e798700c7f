"""Dynamo's own frontend and mocker as a shape of ``python -m bench mesh`` (``--shape dynamo``).

Issue 10's goals are ratios to Dynamo's Rust frontend, and this machine's speed moves by up to 2x from
hour to hour, so the peer is measured in the same run, by the same load generator, on the same demo
model: ``python -m dynamo.frontend`` (HTTP on the bench's port, the same router mode, file discovery)
and one ``python -m dynamo.mocker`` per worker at the same speed-up, with our NATS for its events. Every
listener is on 127.0.0.1 and the logs are at ``warn``, as the mesh's are in the bench.

Dynamo 1.6.1 comes from PyPI into its own environment (``.venv-dynamo``, built on first use or by
``python -m bench dynamo-env``). One of its dependencies, ``aisimulate`` (the optional AIC perf model),
is only on pypi.nvidia.com, so the two Dynamo wheels go in without dependencies and the rest at the
pins below.

In the table the frontend process is the ``gw`` column and the mockers are ``workers``; there is no
Envoy and no separate stage.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import subprocess
import sys
import time
from collections.abc import Sequence

from services.launcher.plan import ROOT, VENV_BIN, ProcessSpec, free_port
from services.launcher.processes import Mesh, wait_port

VENV = ROOT / ".venv-dynamo"
DYNAMO = ("ai-dynamo==1.6.1", "ai-dynamo-runtime==1.6.1")
DEPENDENCIES = ("aiohttp==3.14.5", "certifi==2026.10.19.post1", "kubernetes==32.0.1", "msgspec==0.23.0",
                "prometheus-client==0.26.0", "pyzmq==27.3.0", "redis==8.1.0", "tqdm==4.70.1",
                "transformers==5.24.0", "typing-extensions==4.16.0", "zstandard==0.25.0", "pydantic==2.13.5",
                "uvloop==0.23.0")
FRONTEND = "gateway-dynamo"  # folds into the gw column (bench/cpu.py)


def python() -> pathlib.Path:
    return VENV / "bin" / "python"


def ensure_venv() -> pathlib.Path:
    """Creates ``.venv-dynamo`` unless its stamp says it holds these pins; returns its python."""
    stamp = VENV / ".meshfront-dynamo"
    wanted = "\n".join((*DYNAMO, *DEPENDENCIES))
    if stamp.is_file() and stamp.read_text() == wanted:
        return python()
    print(f"building {VENV} ({', '.join(DYNAMO)}; about a minute)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pip = [str(python()), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--no-deps", *DYNAMO], check=True)
    subprocess.run([*pip, *DEPENDENCIES], check=True)
    subprocess.run([str(python()), "-c", "import dynamo.frontend, dynamo.mocker"], check=True)
    stamp.write_text(wanted)
    return python()


def environment(run_dir: pathlib.Path, nats_port: int) -> dict[str, str]:
    """What every Dynamo process gets: file discovery in ``run_dir``, our NATS, loopback listeners."""
    return {"DYN_FILE_KV": str(run_dir / "kv"), "NATS_SERVER": f"nats://127.0.0.1:{nats_port}",
            "DYN_TCP_RPC_HOST": "127.0.0.1", "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
            "DYN_SYSTEM_HOST": "127.0.0.1", "DYN_EVENT_PLANE_HOST": "127.0.0.1", "DYN_LOG": "warn",
            "PYTHONUNBUFFERED": "1"}


def commands(dynamo_python: pathlib.Path, model_dir: str, model_name: str, workers: int, speedup: float,
             router_mode: str, http_port: int, nats_port: int, run_dir: pathlib.Path,
             disaggregation_modes: Sequence[str] = (), mocker_flags: Sequence[str] = ()) -> list[tuple[str, list[str]]]:
    """(name, argv) of every process, NATS first. ``disaggregation_modes``: each mocker's
    ``--disaggregation-mode`` (prefill, decode or agg; none given: all agg), as bench/disagg.py runs them, with
    ``mocker_flags`` besides."""
    modes = list(disaggregation_modes) or ["agg"] * workers
    py = str(dynamo_python)
    out = [("nats", [str(VENV_BIN / "nats-server"), "-js", "-a", "127.0.0.1", "-p", str(nats_port),
                     "-sd", str(run_dir / "nats")]),
           (FRONTEND, [py, "-m", "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", str(http_port),
                       "--discovery-backend", "file", "--router-mode", router_mode])]
    out += [(f"mocker-{i}", [py, "-m", "dynamo.mocker", "--model-path", model_dir, "--model-name", model_name,
                             "--speedup-ratio", f"{speedup:g}", "--discovery-backend", "file",
                             *(("--disaggregation-mode", mode) if mode != "agg" else ()), *mocker_flags])
            for i, mode in enumerate(modes)]
    return out


class DynamoMesh(Mesh):
    """Dynamo's processes under the launcher's ``Mesh`` process handling (logs, teardown)."""

    def __init__(self, log_dir: pathlib.Path, model_dir: str, model_name: str, workers: int, speedup: float,
                 router_mode: str, disaggregation_modes: Sequence[str] = (), mocker_flags: Sequence[str] = ()):
        super().__init__(plan=None, log_dir=log_dir)  # type: ignore[arg-type]  # no launcher plan here
        self.http_port, self.nats_port = free_port(), free_port()
        self.model_dir, self.model_name, self.workers = model_dir, model_name, workers
        self.speedup, self.router_mode = speedup, router_mode
        self.disaggregation_modes, self.mocker_flags = tuple(disaggregation_modes), tuple(mocker_flags)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self, timeout: float = 90.0) -> DynamoMesh:
        run_dir = self.log_dir / "run"
        run_dir.mkdir(parents=True, exist_ok=True)
        env = environment(run_dir, self.nats_port)
        deadline = time.monotonic() + timeout
        try:
            for name, argv in commands(ensure_venv(), self.model_dir, self.model_name, self.workers, self.speedup,
                                       self.router_mode, self.http_port, self.nats_port, run_dir,
                                       self.disaggregation_modes, self.mocker_flags):
                self.start_process(ProcessSpec(name, argv, self.nats_port if name == "nats" else 0, env))
                if name == "nats" and not wait_port(self.nats_port, deadline):
                    raise RuntimeError(f"nats did not open port {self.nats_port}:\n{self.logs('nats')}")
            self.wait_models(1, deadline)
            self._wait_workers(deadline)
        except BaseException:
            print(self.all_logs())
            self.stop()
            raise
        return self

    def _wait_workers(self, deadline: float) -> None:
        """Until /health lists a generate endpoint per mocker (the frontend has discovered them all)."""
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                instances = json.loads(self._get("/health"))["instances"]
                if sum(i["endpoint"] == "generate" for i in instances) >= self.workers:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"Dynamo's frontend did not list {self.workers} workers in time\n{self.all_logs()}")


def start(log_dir: pathlib.Path, model_dir: str, model_name: str, workers: int, speedup: float,
          router_mode: str, disaggregation_modes: Sequence[str] = (), mocker_flags: Sequence[str] = ()) -> DynamoMesh:
    return DynamoMesh(log_dir, model_dir, model_name, workers, speedup, router_mode, disaggregation_modes,
                      mocker_flags).start()
