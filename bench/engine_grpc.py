"""The ``grpc`` and ``smg`` shapes of ``python -m bench engine``: frontends over a stock ``vllm serve --grpc`` engine.

- ``grpc``: Envoy -> gateway (stages in-process) -> the engine's gRPC servicer, the engine attached with
  ``meshfront attach --engine-grpc`` as ``meshfront run --engine-grpc`` runs it (issue 38);
- ``smg``: SMG 1.13's router (bench/smg_peer.py) in gRPC mode over the same kind of engine.

The engine is ``vllm.entrypoints.launchers.grpc_server`` (what ``vllm serve --grpc`` runs; docs/engine-grpc.md)
from ``.venv-vllm`` with the bench's engine flags, model and served name. Its own process is the servicer (gRPC,
the token-in request mapping, AsyncLLM's client side); it is reported as ``servicer`` and counted to the frontend
side, as issue 38 item 5 and issue 40 item 4 ask: both frontends need it, as vLLM's server needs its API process
and Meshfront's worker path its worker. Every process below it (``EngineCore``) is the engine.
"""

from __future__ import annotations

import atexit
import math
import os
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench import smg_peer
from bench.engine import (
    SERVER,
    Deployment,
    EngineBenchConfig,
    EngineRecord,
    MeshDeployment,
    Tracked,
    _engine_python,
    _kill_group,
)
from services.launcher.plan import WorkerSpec, free_port

SERVICER = "servicer"  # the engine's own process (report column)
ROUTER = "smg"  # SMG's router process (report column)
# Columns that together are what each shape spends outside the engine (issue 40 item 4's "frontend total").
FRONT_TOTAL = "fe-total"


def front_total(per_group: dict[str, float]) -> float:
    """Every column but the engine: the frontend processes, our worker, vLLM's API server, the servicer."""
    return sum(v for g, v in per_group.items() if g not in ("engine", "total", "frontend", FRONT_TOTAL))


class GrpcEngine:
    """One ``vllm serve --grpc`` engine on a free port, ready once its gRPC health says SERVING."""

    def __init__(self, cfg: EngineBenchConfig, model_dir: str, log_dir: Path):
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        argv = [str(_engine_python()), "-m", "vllm.entrypoints.launchers.grpc_server", "--model", model_dir,
                "--served-model-name", cfg.model_name, "--host", "127.0.0.1", "--port", str(self.port),
                *cfg.engine_flags]
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / "vllm-grpc.log"
        with self.log_path.open("ab") as log:
            env = {**os.environ, "VLLM_HOST_IP": "127.0.0.1", "PYTHONUNBUFFERED": "1"}
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        atexit.register(_kill_group, self.proc)
        try:
            self._wait_serving(time.monotonic() + cfg.start_timeout_s)
        except BaseException:
            self.stop()
            raise

    def _wait_serving(self, deadline: float) -> None:
        with grpc.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                self.check()
                try:
                    reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)  # type: ignore[attr-defined]
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass  # not listening yet, or listening before its engine is up
                time.sleep(0.5)
        raise RuntimeError(f"vllm serve --grpc did not serve in time:\n{self.logs()}")

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"vllm serve --grpc exited with {self.proc.returncode}:\n{self.logs()}")

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""

    def stop(self, grace: float = 30.0) -> list[str]:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            _kill_group(self.proc)
            self.proc.wait()
            return ["vllm serve --grpc ignored SIGTERM"]
        return []


class GrpcMeshDeployment(Deployment):
    """The all-in-one mesh with the engine attached over its gRPC (no worker of ours)."""

    def __init__(self, cfg: EngineBenchConfig, model_dir: str, log_dir: Path, tracked: Tracked):
        self.name, self.tracked = "grpc", tracked
        self.engine = GrpcEngine(cfg, model_dir, log_dir)
        try:
            registrar = WorkerSpec(model_dir, cfg.model_name, "attach", ("--engine-grpc", self.engine.address))
            self.mesh = MeshDeployment(cfg, "inproc", model_dir, log_dir, tracked, workers=[registrar])
        except BaseException:
            self.engine.stop()
            raise
        self.url = self.mesh.url
        self.pids = {**self.mesh.pids, SERVICER: self.engine.proc.pid}
        self.roots = {SERVICER: self.engine.proc.pid}

    def check(self) -> None:
        self.engine.check()
        self.mesh.check()

    def logs(self) -> str:
        return self.mesh.logs() + "\n--- vllm serve --grpc ---\n" + self.engine.logs()

    def stop(self) -> list[str]:
        self.tracked.expand(self.roots)
        return self.mesh.mesh.stop(grace=30.0) + self.engine.stop() + self.tracked.reap()


class SmgDeployment(Deployment):
    """SMG's router in gRPC mode over one ``vllm serve --grpc`` engine."""

    def __init__(self, cfg: EngineBenchConfig, model_dir: str, log_dir: Path, tracked: Tracked):
        self.name, self.tracked = "smg", tracked
        smg_python = smg_peer.ensure_venv()
        self.engine = GrpcEngine(cfg, model_dir, log_dir)
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_dir / "smg.log"
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(smg_peer.router_argv(smg_python, [self.engine.address], model_dir, port,
                                                              free_port()),
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        atexit.register(_kill_group, self.proc)
        self.pids = {ROUTER: self.proc.pid, SERVICER: self.engine.proc.pid}
        self.roots = {SERVICER: self.engine.proc.pid}
        try:
            self._wait_ready(cfg.model_name, time.monotonic() + cfg.start_timeout_s)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, model: str, deadline: float) -> None:
        import urllib.request

        import orjson

        # /v1/models lists the model before its tokenizer is loaded (chat answers 503 tokenizer_not_ready), so
        # ready means one chat completion answered
        body = orjson.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
        while time.monotonic() < deadline:
            self.check()
            request = urllib.request.Request(f"{self.url}/v1/chat/completions", body,
                                             {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=5) as r:
                    if r.status == 200:
                        return
            except (OSError, ValueError):
                pass  # not up yet, no worker yet, or no tokenizer yet
            time.sleep(0.5)
        raise RuntimeError(f"SMG did not serve {model} in time:\n{self.logs()}")

    def check(self) -> None:
        self.engine.check()
        if self.proc.poll() is not None:
            raise RuntimeError(f"SMG exited with {self.proc.returncode}:\n{self.logs()}")

    def logs(self) -> str:
        own = self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""
        return own + "\n--- vllm serve --grpc ---\n" + self.engine.logs()

    def stop(self) -> list[str]:
        self.tracked.expand(self.roots)
        problems = []
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(15.0)
        except subprocess.TimeoutExpired:
            problems.append("SMG ignored SIGTERM")
            _kill_group(self.proc)
            self.proc.wait()
        return problems + self.engine.stop() + self.tracked.reap()


def peer_lines(records: Iterable[EngineRecord]) -> list[str]:
    """Issue 40 item 4: per level, each Meshfront shape's frontend total (everything outside the engine) against
    vLLM's API server process and against SMG's router plus servicer, in this run."""
    recs = list(records)
    peers = {(r.deployment, r.stats.concurrency): r.cpu_per_request.get(FRONT_TOTAL, math.nan) for r in recs
             if r.deployment in ("vllm", "smg")}
    out = []
    for r in recs:
        if r.deployment in ("vllm", "smg"):
            continue
        c, ours = r.stats.concurrency, r.cpu_per_request.get(FRONT_TOTAL, math.nan)
        parts = []
        for peer, label in (("vllm", f"vLLM's {SERVER}"), ("smg", "SMG router + servicer")):
            theirs = peers.get((peer, c))
            if theirs is not None:
                verdict = "MET" if ours <= theirs else "NOT MET"
                parts.append(f"{label} {theirs:.2f} ({ours / theirs:.2f}x, {verdict})")
        out.append(f"c={c} {r.deployment}: frontend total {ours:.2f} CPU ms/req vs " + "; ".join(parts or ["no peer"]))
    return out
