"""A whole mesh (NATS, Envoy, every service, mocker workers) for the mesh tier."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator

import pytest

from services.launcher.plan import WorkerSpec, ephemeral_plan
from services.launcher.processes import Mesh
from tests.conftest import MOCKER_SCRIPT, ROOT, sdk_client, stop_cleanly

pytestmark = pytest.mark.mesh

DEMO = "meshfront/demo-qwen"
SECOND = "demo-second"
# The demo model's formats, as `meshfront run` registers them (tests/mesh/test_tools.py relies on them).
DEMO_PARSERS = ("--tool-call-parser", "hermes", "--reasoning-parser", "qwen3")


def mocker(model_dir, name: str, speedup: str = "200", *extra: str) -> WorkerSpec:
    return WorkerSpec(str(model_dir), name, "mocker", ("--script", str(MOCKER_SCRIPT), "--speedup-ratio", speedup,
                                                       *extra))


def start_mesh(tmp_path_factory, workers, **kw) -> Mesh:
    plan = ephemeral_plan(workers, run_dir=ROOT / ".run" / "tests", **kw)
    mesh = Mesh(plan, tmp_path_factory.mktemp("mesh-logs"))
    mesh.start()
    return mesh


@pytest.fixture(scope="session")
def mesh(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    """Split mesh: two workers for the demo model, one for a second model."""
    m = start_mesh(tmp_path_factory, [mocker(demo_model_dir, DEMO, "200", *DEMO_PARSERS),
                                      mocker(demo_model_dir, DEMO, "200", *DEMO_PARSERS),
                                      mocker(demo_model_dir, SECOND)])
    yield m
    stop_cleanly(m)


@pytest.fixture
def client(mesh):
    c = sdk_client(mesh, timeout=30)
    yield c
    c.close()


def wait_until(predicate, timeout: float, what: str):
    """Polls ``predicate`` until it returns something true (returned), failing with ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@contextlib.contextmanager
def restored(mesh: Mesh, name: str) -> Iterator[None]:
    """Starts ``name`` again when the block ends, passing or failing, once it went down in it: the module's next
    tests need the whole mesh, and a restart placed after a failed assertion never ran. A process still running
    10 s after the block was never taken down, and is left as it is."""
    try:
        yield
    finally:
        try:
            mesh.procs[name].wait(10)
        except subprocess.TimeoutExpired:
            pass
        else:
            mesh.restart(name)
