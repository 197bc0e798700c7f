"""Starts the mesh's real processes (for tests and benchmarks) and stops them cleanly.

It runs the launcher's own process specs (services/launcher/plan.py), so the
tests exercise exactly what ``meshfront run`` starts. Teardown SIGTERMs every
process and fails loudly if one had to be killed or had already crashed.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import pathlib
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request

from services.launcher.plan import MeshPlan, ProcessSpec, specs


def wait_port(port: int, deadline: float) -> bool:
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
        time.sleep(0.05)
    return False


def _kill_if_running(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


class Mesh:
    def __init__(self, plan: MeshPlan, log_dir: pathlib.Path):
        self.plan = plan
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen] = {}
        self.specs: dict[str, ProcessSpec] = {}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.plan.http_port}"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.plan.http_port}"

    def start_process(self, spec: ProcessSpec) -> subprocess.Popen:
        log = open(self.log_dir / f"{spec.name}.log", "ab")  # noqa: SIM115 - closed with the process
        env = {**os.environ, **spec.env}
        proc = subprocess.Popen(spec.argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        # Each process has its own session (so a test can signal it alone); if the test run dies
        # without its teardown, nothing else would stop them.
        atexit.register(_kill_if_running, proc)
        self.procs[spec.name] = proc
        self.specs[spec.name] = spec
        return proc

    def start(self, timeout: float = 60.0) -> Mesh:
        """Starts every process and waits until the models are served; on failure, shows every log and
        stops what was started before raising, so a broken start leaves nothing running."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout
        try:
            for spec in specs(self.plan):
                self.start_process(spec)
            for name, spec in self.specs.items():
                while not wait_port(spec.ready_port, min(deadline, time.monotonic() + 1)):
                    self.raise_if_one_exited()
                    if time.monotonic() >= deadline:
                        raise RuntimeError(f"{name} did not open port {spec.ready_port}:\n{self.logs(name)}")
            self.wait_models(len({w.model_name for w in self.plan.workers}), deadline)
            self.wait_healthy(deadline)
        except BaseException:
            print(self.all_logs())
            self.stop()
            raise
        return self

    def raise_if_one_exited(self) -> None:
        """Fails a start at once when a process is gone, naming it, instead of waiting out the deadline
        for a port or a model that will never come."""
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with code {proc.returncode} while the mesh started:\n"
                                   f"{self.logs(name)}")

    def ssl_context(self) -> ssl.SSLContext | None:
        """How this process's own readiness checks trust the edge (a TLS mesh's tests give their CA)."""
        return None

    def _get(self, path: str) -> bytes:
        """GET through Envoy; raises OSError (HTTPError included) when it does not answer 200."""
        with urllib.request.urlopen(f"{self.url}{path}", timeout=1,  # noqa: S310 - our own URL
                                    context=self.ssl_context()) as r:
            return r.read()

    def _models_served(self) -> int:
        """How many models have a live worker, from /health: open under --auth, where /v1/models takes a key, and
        its body counts them while it still answers 503 (warming)."""
        try:
            body = self._get("/health")
        except urllib.error.HTTPError as e:
            body = e.read()
        return len(json.loads(body)["models"])

    def wait_models(self, count: int, deadline: float) -> None:
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError, KeyError):
                if self._models_served() >= count:
                    return
            self.raise_if_one_exited()
            time.sleep(0.1)
        raise RuntimeError(f"models did not register in time\n{self.all_logs()}")

    def wait_healthy(self, deadline: float) -> None:
        """Until /health answers 200: every gateway has warmed the workers it knew at start, so the first
        request does not race the warm-up (what ``meshfront run`` waits for before it prints the URL)."""
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                self._get("/health")
                return
            self.raise_if_one_exited()
            time.sleep(0.05)
        raise RuntimeError(f"/health did not answer 200 in time\n{self.all_logs()}")

    def full_log(self, name: str) -> str:
        """All that ``name`` logged so far (``logs`` keeps only the tail)."""
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def restart(self, name: str, timeout: float = 30.0) -> None:
        """Starts ``name`` again from its spec once the old process is gone, and waits for its port."""
        self.procs[name].wait(10)
        spec = self.specs[name]
        self.start_process(spec)
        if not wait_port(spec.ready_port, time.monotonic() + timeout):
            raise RuntimeError(f"{name} did not open port {spec.ready_port} again:\n{self.logs(name)}")

    def logs(self, name: str) -> str:
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def all_logs(self) -> str:
        return "\n".join(f"--- {n}\n{self.logs(n)}" for n in self.procs)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        self.procs[name].send_signal(sig)

    def stop(self, grace: float = 15.0) -> list[str]:
        """SIGTERMs everything (Envoy and gateways first); returns the names that misbehaved."""
        problems = []
        order = sorted(self.procs, key=lambda n: (n != "envoy", not n.startswith("gateway"),
                                                  n == "nats" or n.startswith("nats-")))
        for name in order:
            proc = self.procs[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for name in order:
            proc = self.procs[name]
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                problems.append(f"{name} ignored SIGTERM")
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        return problems
