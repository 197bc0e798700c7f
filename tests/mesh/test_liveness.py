"""Dead workers stay dead when NATS restores their registrations and when a new worker takes their port
(services/common/liveness.py); a mocker in script mode migrates mid-answer token for token."""

from __future__ import annotations

import asyncio
import re
import signal
import threading
import time

import httpx
import pytest

from services.launcher.plan import WorkerSpec
from services.launcher.processes import wait_port
from tests.conftest import stop_cleanly
from tests.mesh.chaos_client import chat, run_streams
from tests.mesh.conftest import DEMO, SECOND, mocker, start_mesh, wait_until

pytestmark = pytest.mark.mesh


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    """Two workers for the demo model (the second to die and come back on its port), one for a second model
    (to die for good)."""
    m = start_mesh(tmp_path_factory, [mocker(demo_model_dir, DEMO), mocker(demo_model_dir, DEMO),
                                      mocker(demo_model_dir, SECOND)])
    yield m
    stop_cleanly(m)


def worker_at(mesh, index: int, exclude: str = "") -> str:
    """The id of the worker the gateway saw register on mocker-``index``'s port (the latest, but not ``exclude``)."""
    address = f":{mesh.plan.worker_ports[index]}"
    ids = [wid for wid, addr in re.findall(r"worker (\S+) serves \S+ at (\S+)", mesh.full_log("gateway-0"))
           if addr.endswith(address) and wid != exclude]
    return ids[-1] if ids else ""


def left(mesh, worker_id: str) -> bool:
    return f"worker {worker_id} left" in mesh.full_log("gateway-0")


def health(mesh) -> dict:
    return httpx.get(f"{mesh.url}/health", timeout=5).json()


def ask(mesh, model: str, pin: str = "") -> httpx.Response:
    return httpx.post(f"{mesh.url}/v1/chat/completions", timeout=30,
                      headers={"x-worker-instance-id": pin} if pin else {},
                      json={"model": model, "messages": [{"role": "user", "content": "Count to ten"}],
                            "max_tokens": 4, "nvext": {"extra_fields": ["worker_id"]}})


class Load:
    """Requests in a loop on a thread, every status kept."""

    def __init__(self, mesh):
        self.mesh, self.statuses = mesh, []  # status codes, or the error of a request that got none
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                try:
                    r = client.post(f"{self.mesh.url}/v1/chat/completions",
                                    json={"model": DEMO, "messages": [{"role": "user", "content": "Count to ten"}],
                                          "max_tokens": 4})
                except httpx.HTTPError as e:  # a failed request, kept like a bad status
                    self.statuses.append(repr(e))
                else:
                    self.statuses.append(r.status_code)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(60)


def restart_nats(mesh, sig: int) -> None:
    mesh.kill("nats", sig)
    mesh.restart("nats")
    assert wait_port(mesh.plan.nats_port, time.monotonic() + 10)


def test_dead_workers_stay_gone_after_nats_restores_their_registrations(fleet):
    dead_demo, dead_second = worker_at(fleet, 1), worker_at(fleet, 2)
    assert dead_demo and dead_second
    fleet.kill("mocker-1")
    fleet.kill("mocker-2")
    wait_until(lambda: left(fleet, dead_demo) and left(fleet, dead_second), 20, "the killed workers' keys to expire")
    fleet.restart("mocker-1")  # on the same port, under a new id
    reborn = wait_until(lambda: worker_at(fleet, 1, exclude=dead_demo), 20, "the restarted worker")
    time.sleep(5)  # as the fault probe found them: expired a while before NATS went down
    with Load(fleet) as load:
        # A clean stop writes the stream's state (nats-server also does every ~2 min); a SIGKILL after it
        # brings the expired registrations back, and nats-server never expires them again.
        restart_nats(fleet, signal.SIGTERM)
        time.sleep(3)
        restart_nats(fleet, signal.SIGKILL)
        time.sleep(3)
    assert load.statuses and set(load.statuses) == {200}, load.statuses
    # A gateway and a router started after the restore read the bucket afresh (supervision restarts them).
    for name in ("gateway-0", "router"):
        fleet.kill(name)
        fleet.restart(name)
    try:
        wait_until(lambda: health(fleet).get("status") == "healthy", 40, "the restarted gateway")
    except AssertionError as e:
        raise AssertionError(f"{e}: {health(fleet)}\n{fleet.logs('gateway-0')}") from None
    time.sleep(1)
    assert health(fleet)["models"] == {DEMO: 2}
    assert {m["id"] for m in httpx.get(f"{fleet.url}/v1/models", timeout=5).json()["data"]} == {DEMO}
    serving = set()
    for _ in range(8):
        r = ask(fleet, DEMO)
        assert r.status_code == 200, r.text
        serving.add(r.json()["nvext"]["worker_id"]["decode_worker_id"])
    assert serving == {worker_at(fleet, 0), reborn}
    for pin in (dead_demo, dead_second):
        r = ask(fleet, DEMO, pin)
        assert r.status_code in (400, 503), r.text  # refused, not answered by whoever has the port now
    assert ask(fleet, DEMO, reborn).status_code == 200
    assert ask(fleet, SECOND).status_code == 404
    assert "ignoring worker" in fleet.full_log("gateway-0") + fleet.full_log("router"), \
        "NATS restored no expired registration: this test proved nothing"


# -- script mode migrates mid-answer --------------------------------------------------------------------

# ~150 tokens at ~12 ms a token (speed-up 0.5): a kill lands mid-answer.
ANSWER = " ".join(f"Sentence {i} of the scripted answer, which goes on for a while." for i in range(12))


@pytest.fixture(scope="module")
def scripted(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    spec = WorkerSpec(str(demo_model_dir), DEMO, "mocker", ("--output-text", ANSWER, "--speedup-ratio", "0.5"))
    m = start_mesh(tmp_path_factory, [spec, spec])
    yield m
    stop_cleanly(m)


def test_a_scripted_answer_migrated_mid_stream_is_the_undisturbed_one(scripted):
    bodies = [chat(DEMO, i, 400) for i in range(8)]
    reference = asyncio.run(run_streams(scripted.url, bodies))
    assert [r.text for r in reference] == [ANSWER] * len(bodies)
    before = scripted.full_log("postprocessor").count(" migrates from ")

    async def kill_when_streaming(events):
        await asyncio.gather(*(e.wait() for e in events))
        scripted.kill("mocker-0")

    disturbed = asyncio.run(run_streams(scripted.url, bodies, kill_when_streaming))
    assert all(r.done and not r.error and r.finish == "stop" for r in disturbed), disturbed
    assert [r.text for r in disturbed] == [ANSWER] * len(bodies)
    assert scripted.full_log("postprocessor").count(" migrates from ") - before >= 1, "no stream was migrated"
