"""Client disconnects reach the worker; a dead worker's model leaves /v1/models without hurting others."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from services.launcher.plan import WorkerSpec, ephemeral_plan
from services.launcher.processes import Mesh
from tests.conftest import ROOT, stop_cleanly
from tests.mesh.chaos_client import stream_then_hang_up
from tests.mesh.conftest import DEMO, SECOND, mocker, start_mesh

pytestmark = pytest.mark.mesh

LONG = {"model": DEMO, "messages": [{"role": "user", "content": "Write forever"}], "max_tokens": 3000,
        "ignore_eos": True}


@pytest.fixture(scope="module")
def paced_mesh(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    """Real-speed mocker (speed-up 1: several ms per token) so a long stream is still running when we leave."""
    m = start_mesh(tmp_path_factory, [mocker(demo_model_dir, DEMO, "1"), mocker(demo_model_dir, SECOND, "50")])
    yield m
    stop_cleanly(m)


def wait_for_log(mesh, name: str, needle: str, timeout: float) -> float | None:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if needle in mesh.logs(name):
            return time.monotonic() - start
        time.sleep(0.02)
    return None


def test_streaming_disconnect_stops_generation_on_the_worker(paced_mesh):
    before = paced_mesh.logs("mocker-0").count("aborted by the caller")
    stream_then_hang_up(paced_mesh.plan.http_port, LONG, frames=5)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 3:
        if paced_mesh.logs("mocker-0").count("aborted by the caller") > before:
            break
        time.sleep(0.02)
    else:
        pytest.fail("worker kept generating after the client left:\n" + paced_mesh.logs("mocker-0"))


async def test_a_cancelled_kserve_stream_stops_the_worker(paced_mesh):
    """tritonclient cancels its stream mid-generation; the worker logs the abort. Here on the paced worker: on the
    fast mesh a loaded CI machine let all the tokens out before the cancel landed, and nothing was left to abort."""
    import tritonclient.grpc.aio as triton_aio

    from tests.mesh.test_kserve import bytes_input

    before = paced_mesh.logs("mocker-0").count("aborted by the caller")
    client = triton_aio.InferenceServerClient(paced_mesh.grpc_target)

    async def endless():
        yield {"model_name": DEMO, "inputs": [bytes_input("text_input", "Write forever")],
               "parameters": {"max_tokens": 3000, "ignore_eos": True}}
        await asyncio.sleep(30)  # keep the request side open, like a client that waits for more

    stream = client.stream_infer(endless())
    try:
        seen = 0
        async for _result, error in stream:
            assert error is None, error
            seen += 1
            if seen == 2:
                break
        stream.cancel()
    finally:
        await client.close()
    t0 = time.monotonic()
    while paced_mesh.logs("mocker-0").count("aborted by the caller") == before:
        assert time.monotonic() - t0 < 5, "the worker kept generating after the client cancelled"
        await asyncio.sleep(0.02)


def test_non_streaming_disconnect_stops_generation_on_the_worker(paced_mesh):
    before = paced_mesh.logs("mocker-0").count("aborted by the caller")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{paced_mesh.url}/v1/chat/completions", json=LONG, timeout=httpx.Timeout(10, read=0.5))
    t0 = time.monotonic()
    while time.monotonic() - t0 < 3:
        if paced_mesh.logs("mocker-0").count("aborted by the caller") > before:
            return
        time.sleep(0.02)
    pytest.fail("worker kept generating after the client left")


def test_killed_worker_takes_its_model_away_and_others_keep_serving(paced_mesh):
    def models():
        return {m["id"] for m in httpx.get(f"{paced_mesh.url}/v1/models", timeout=5).json()["data"]}

    assert {DEMO, SECOND} <= models()
    paced_mesh.kill("mocker-1")
    ok, t0 = 0, time.monotonic()
    while SECOND in models():
        assert time.monotonic() - t0 < 15, "dead worker's model still listed after 15 s"
        r = httpx.post(f"{paced_mesh.url}/v1/chat/completions", timeout=30,
                       json={"model": DEMO, "messages": [{"role": "user", "content": "Count to ten"}],
                             "max_tokens": 4})
        assert r.status_code == 200, r.text
        ok += 1
    assert ok >= 1
    gone = httpx.post(f"{paced_mesh.url}/v1/chat/completions", timeout=30,
                      json={"model": SECOND, "messages": [{"role": "user", "content": "hi"}]})
    assert gone.status_code == 404 and gone.json()["error"]["param"] == "model"


def test_a_process_that_dies_while_the_mesh_starts_fails_the_start_at_once_naming_it(
        tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    """Without this, a worker refused at start (a bad flag, too little memory) cost the whole start timeout."""
    broken = WorkerSpec(str(demo_model_dir), DEMO, "mocker", ("--speedup-ratio", "not-a-number"))
    plan = ephemeral_plan([broken], run_dir=ROOT / ".run" / "tests")
    mesh = Mesh(plan, tmp_path_factory.mktemp("broken-start"))
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"mocker-0 exited with code [1-9]\d* while the mesh started"):
        mesh.start(timeout=120)
    assert time.monotonic() - started < 60
    assert all(proc.poll() is not None for proc in mesh.procs.values()), "a failed start left processes running"
