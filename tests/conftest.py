"""Shared fixtures. Under CI=true a missing Envoy, NATS or model directory fails; nothing is skipped."""

from __future__ import annotations

import os
import pathlib
import shutil
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
BIN = pathlib.Path(sys.executable).parent
MODEL_DIR = ROOT / "build" / "models" / "demo-qwen"
TINY_LM_DIR = ROOT / "build" / "models" / "tiny-qwen2"
MOCKER_SCRIPT = ROOT / "tests" / "golden" / "mocker_script.json"
IN_CI = os.environ.get("CI", "").lower() == "true"


def require_binary(name: str) -> str:
    path = BIN / name
    if not path.exists():
        found = shutil.which(name)
        if found is None:
            message = f"{name} is not installed (pip install -e . brings it)"
            if IN_CI:
                pytest.fail(message)
            pytest.skip(message)
        return found
    return str(path)


@pytest.fixture(scope="session")
def demo_model_dir() -> pathlib.Path:
    from services.models.build import build_demo_model

    return build_demo_model(MODEL_DIR)


@pytest.fixture(scope="session")
def envoy_bin() -> str:
    return require_binary("envoy")


@pytest.fixture(scope="session")
def nats_bin() -> str:
    return require_binary("nats-server")


def require_module(name: str):
    """Imports an optional dependency; its absence fails under CI and skips elsewhere."""
    try:
        return __import__(name)
    except ImportError:
        message = f"{name} is not installed (make venv installs it)"
        if IN_CI:
            pytest.fail(message, pytrace=False)
        pytest.skip(message, allow_module_level=True)


@pytest.fixture
def nats_url(nats_bin, tmp_path):
    """A private nats-server with JetStream on a free loopback port, serving before the test starts."""
    import subprocess
    import time

    from services.launcher.plan import free_port
    from services.launcher.processes import wait_port

    port = free_port()
    proc = subprocess.Popen([nats_bin, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(tmp_path / "js")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_port(port, time.monotonic() + 10), "nats-server did not start"
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


async def wait_for(predicate, timeout: float, what: str) -> None:
    """Polls ``predicate`` on the running loop until it holds, failing with ``what`` after ``timeout`` s."""
    import asyncio

    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


TRACEBACK = "Traceback (most recent call last):"


def unexpected_tracebacks(log_dir: pathlib.Path, expected: tuple[str, ...] = ()) -> list[str]:
    """Every traceback a service logged under ``log_dir``, less those containing an ``expected`` text."""
    found = []
    for log in sorted(log_dir.glob("*.log")):
        text = log.read_text(errors="replace")
        for chunk in text.split(TRACEBACK)[1:]:
            # A traceback ends at the exception line: the first line that is not indented.
            lines = chunk.splitlines()
            end = next((i for i, line in enumerate(lines[1:], 1) if line and not line.startswith(" ")), len(lines))
            tb = "\n".join(lines[: end + 1])
            if not any(e in tb for e in expected):
                found.append(f"{log.name}:{tb}")
    return found


def stop_cleanly(mesh, expected_tracebacks: tuple[str, ...] = ()) -> None:
    """Stops a test mesh; fails if a process ignored SIGTERM (every process must drain and exit) or if a
    service logged a traceback the test did not expect (a bug the client may never have seen)."""
    problems = mesh.stop()
    assert not problems, problems
    tracebacks = unexpected_tracebacks(mesh.log_dir, expected_tracebacks)
    assert not tracebacks, "services logged unexpected tracebacks:\n" + "\n\n".join(tracebacks)


def sdk_client(mesh, timeout: float = 30):
    """The official openai client against a mesh's Envoy, without retries (a failure must show)."""
    import openai

    return openai.OpenAI(base_url=f"{mesh.url}/v1", api_key="unused", max_retries=0, timeout=timeout)
