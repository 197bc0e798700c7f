"""A whole mesh (NATS, Envoy, every service, mocker workers) for the mesh tier."""

from __future__ import annotations

import time

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
