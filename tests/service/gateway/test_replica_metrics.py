"""The edge's /metrics gather over a real NATS: each replica's answer holds every live replica's series."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.gateway.edge.replicas import ReplicaMetrics
from services.gateway.frontend_metrics import MeshfrontRecorder, Outcome

pytestmark = pytest.mark.service


def requests_by_replica(text: bytes) -> dict[str, float]:
    fams = {f.name: f for f in text_string_to_metric_families(text.decode())}
    return {s.labels["gateway"]: s.value for s in fams["rep_requests"].samples if s.name == "rep_requests_total"}


def served(recorder: MeshfrontRecorder, n: int) -> None:
    for _ in range(n):
        recorder.started("m")
        recorder.ended(Outcome(model="m", endpoint="chat", stream=False, status="200", reason="", started=True,
                               duration_s=0.1, prompt_tokens=3, completion_tokens=2))


async def wait_for(cond, within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_gather_holds_every_replica_and_survives_a_dead_one(nats_url):
    recs = [MeshfrontRecorder("rep") for _ in range(3)]
    for rec, n in zip(recs, (1, 2, 3), strict=True):
        served(rec, n)
    # A peer TTL far past the test: only the missed scrape can make the others forget the dead one.
    gws = [ReplicaMetrics(nats_url, f"gw-{i}:9100", rec.registry, heartbeat_s=0.2, peer_ttl_s=60.0, wait_s=1.0)
           for i, rec in enumerate(recs)]
    tasks = [asyncio.create_task(gw.run()) for gw in gws]
    try:
        await wait_for(lambda: all(len(gw.live_peers()) == 2 for gw in gws))
        for gw in gws:  # whichever replica Envoy asks, the same series
            assert requests_by_replica(await gw.gather()) == {"gw-0:9100": 1, "gw-1:9100": 2, "gw-2:9100": 3}
        # One replica dies: a scrape waits for it no longer than wait_s, then its peers forget it.
        tasks[2].cancel()
        await gws[2].close()
        started = time.monotonic()
        assert requests_by_replica(await gws[0].gather()) == {"gw-0:9100": 1, "gw-1:9100": 2}
        assert time.monotonic() - started < gws[0].wait_s + 0.5
        assert gws[0].live_peers() == {"gw-1:9100"}
        started = time.monotonic()
        assert requests_by_replica(await gws[0].gather()) == {"gw-0:9100": 1, "gw-1:9100": 2}
        assert time.monotonic() - started < 0.5  # every live peer answered: no wait for the deadline
    finally:
        for task in tasks:
            task.cancel()
        for gw in gws:
            await gw.close()


async def test_a_new_replica_learns_its_peers_at_once(nats_url):
    """A replica that starts next to running ones knows them after its first announcement, not after
    their next heartbeat: its scrapes hold every replica's series from the start."""
    old_rec, new_rec = MeshfrontRecorder("rep"), MeshfrontRecorder("rep")
    served(old_rec, 1)
    served(new_rec, 2)
    heartbeat_s = 30.0  # no heartbeat comes during the test: only the answer to the newcomer can tell it
    old = ReplicaMetrics(nats_url, "gw-old:9100", old_rec.registry, heartbeat_s=heartbeat_s, peer_ttl_s=90.0)
    new = ReplicaMetrics(nats_url, "gw-new:9100", new_rec.registry, heartbeat_s=heartbeat_s, peer_ttl_s=90.0)
    tasks = [asyncio.create_task(old.run())]
    try:
        await wait_for(lambda: old._nc is not None)
        await asyncio.sleep(0.2)  # the old replica's first announcement went out before the new one listens
        tasks.append(asyncio.create_task(new.run()))
        await wait_for(lambda: new.live_peers() == {"gw-old:9100"}, within_s=5.0)
        assert requests_by_replica(await new.gather()) == {"gw-old:9100": 1, "gw-new:9100": 2}
    finally:
        for task in tasks:
            task.cancel()
        await old.close()
        await new.close()


async def test_without_nats_a_replica_answers_alone():
    rec = MeshfrontRecorder("rep")
    served(rec, 4)
    gw = ReplicaMetrics("nats://127.0.0.1:1", "gw-solo:9100", rec.registry)  # never connected
    assert requests_by_replica(await gw.gather()) == {"gw-solo:9100": 4}
