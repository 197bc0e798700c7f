"""Every discovery reader judges liveness itself: against a real nats-server that is stopped, killed and
restarted on its own JetStream store, as ``meshfront run`` restarts it (services/common/liveness.py)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time

import pytest

from services.common.discovery import BUCKET, ModelCard, Registrar, WorkerCard, WorkerRegistry, open_bucket
from services.common.nats_connection import connect
from services.launcher.plan import free_port
from services.launcher.processes import wait_port
from tests.conftest import wait_for

pytestmark = [pytest.mark.service, pytest.mark.timeout(90)]


class Nats:
    """One nats-server that keeps its port and store across restarts."""

    def __init__(self, binary: str, store):
        self.binary, self.store, self.port = binary, store, free_port()
        self.proc: subprocess.Popen | None = None
        self.url = f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen([self.binary, "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd",
                                      str(self.store)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert wait_port(self.port, time.monotonic() + 10), "nats-server did not start"

    def stop(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        self.proc.wait(10)


@pytest.fixture
def nats(nats_bin, tmp_path):
    server = Nats(nats_bin, tmp_path / "js")
    server.start()
    yield server
    if server.proc is not None and server.proc.poll() is None:
        server.stop(signal.SIGKILL)


def card(worker_id: str, port: int) -> WorkerCard:
    return WorkerCard(worker_id=worker_id, address=f"127.0.0.1:{port}", model=ModelCard(name="demo", model_dir="/m"))


async def die(registrar: Registrar) -> None:
    """Stops heartbeating without deregistering, as a SIGKILLed worker does."""
    assert registrar._task is not None
    registrar._task.cancel()
    await asyncio.gather(registrar._task, return_exceptions=True)


async def test_a_registration_nats_restores_after_it_expired_is_ignored_by_every_reader(nats):
    alive, dead = Registrar(nats.url, card("alive", 1001)), Registrar(nats.url, card("dead", 1002))
    watching = WorkerRegistry(nats.url, "watching")
    for part in (alive, dead, watching):
        await part.start()
    try:
        await wait_for(lambda: set(watching.workers) == {"alive", "dead"}, 10, "both workers")
        await die(dead)
        await wait_for(lambda: set(watching.workers) == {"alive"}, 15, "the dead worker's key to expire")
        await asyncio.sleep(6.0)  # as the fault probe had it: expired a while before NATS went down
        # A clean stop writes the stream's state (and its TTL state), as nats-server also does every ~2 min;
        # a kill after it brings the expired registration back, and nothing ever expires it again.
        nats.stop(signal.SIGTERM)
        nats.start()
        await asyncio.sleep(3.0)  # heartbeats append to the store after the state it wrote
        nats.stop(signal.SIGKILL)
        nats.start()
        fresh = WorkerRegistry(nats.url, "fresh")  # a service started (or restarted) after the restore
        await fresh.start()
        try:
            await asyncio.wait_for(fresh.synced.wait(), 10)
            nc = await connect(nats.url, "inspect")
            try:
                kv = await open_bucket(nc)
                restored = {e.key for e in await _values(kv)}
            finally:
                await nc.close()
            # Keys are <namespace>.<worker id> (services/common/namespace.py); these cards are the default's.
            assert "dynamo.dead" in restored, "nats-server no longer restores expired keys: this test proves nothing"
            deadline = time.monotonic() + 8  # past the TTL and a heartbeat or two
            while time.monotonic() < deadline:
                assert set(fresh.workers) <= {"alive"}, fresh.workers
                assert set(watching.workers) <= {"alive"}, watching.workers
                await asyncio.sleep(0.1)
            assert set(fresh.workers) == set(watching.workers) == {"alive"}
        finally:
            await fresh.close()
    finally:
        for part in (alive, watching):
            await part.close()


async def _values(kv) -> list:
    watcher = await kv.watchall()
    out = []
    while (entry := await watcher.updates(timeout=5)) is not None:
        if entry.value:
            out.append(entry)
    await watcher.stop()
    return out


async def test_a_worker_nats_never_expires_leaves_once_silent(nats):
    registry = WorkerRegistry(nats.url, "reader", ttl_s=1.0)
    await registry.start()
    nc = await connect(nats.url, "writer")
    try:
        await open_bucket(nc, 1.0)
        # Written without a TTL, as the restored registrations are kept: only the reader can drop it.
        await nc.jetstream().publish(f"$KV.{BUCKET}.stuck", card("stuck", 1003).to_json())
        await wait_for(lambda: "stuck" in registry.workers, 5, "the worker")
        joined = time.monotonic()
        await wait_for(lambda: "stuck" not in registry.workers, 6, "the silent worker to leave")
        assert time.monotonic() - joined >= 1.5, "dropped before two TTLs of silence"
    finally:
        await nc.close()
        await registry.close()


async def test_a_dead_worker_whose_address_a_new_one_took_is_dropped_at_once(nats):
    old, new = Registrar(nats.url, card("old", 1004)), Registrar(nats.url, card("new", 1004))
    registry = WorkerRegistry(nats.url, "reader")
    await registry.start()
    await old.start()
    try:
        await wait_for(lambda: "old" in registry.workers, 10, "the first worker")
        await die(old)  # its key lives on for the TTL
        await new.start()
        await wait_for(lambda: "new" in registry.workers, 10, "the worker on the same port")
        assert set(registry.workers) == {"new"}
        fresh = WorkerRegistry(nats.url, "fresh")  # one that finds both keys at once, in either order
        await fresh.start()
        try:
            await asyncio.wait_for(fresh.synced.wait(), 10)
            assert set(fresh.workers) == {"new"}
        finally:
            await fresh.close()
    finally:
        await new.close()
        await registry.close()


async def test_live_workers_are_kept_through_a_nats_outage_longer_than_their_silence_limit(nats):
    # The worker's key outlives the outage on the server (TTL 10 s, heartbeat every 3.3 s); the reader's
    # silence limit (2 x 2.5 s) is shorter than the outage, so only the outage rule keeps the worker.
    alive = Registrar(nats.url, card("alive", 1005), ttl_s=10.0)
    registry = WorkerRegistry(nats.url, "reader", ttl_s=2.5)
    left: list[str] = []
    registry.subscribe(lambda worker_id, c: left.append(worker_id) if c is None else None)
    await registry.start()
    await alive.start()
    try:
        await wait_for(lambda: "alive" in registry.workers, 10, "the worker")
        nats.stop(signal.SIGKILL)
        await asyncio.sleep(6.0)
        assert "alive" in registry.workers
        nats.start()
        await asyncio.sleep(6.0)  # reconnect; heartbeats resume
        assert "alive" in registry.workers and left == []
    finally:
        await alive.close()
        await registry.close()
