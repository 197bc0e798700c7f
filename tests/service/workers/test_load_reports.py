"""A worker's load reports (services/workers/kv_events.py): a change goes out on the next tick, an unchanged idle
load only as a heartbeat, since every router and gateway replica receives every worker's messages."""

from __future__ import annotations

import asyncio
import time

import nats
import orjson
import pytest

from services.common.kv_events import events_subject
from services.common.namespace import DEFAULT_NAMESPACE
from services.workers import kv_events
from services.workers.kv_events import KvEventPublisher

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]


async def test_an_idle_worker_repeats_its_load_only_as_a_heartbeat_and_a_change_goes_out_at_once(
        nats_url, monkeypatch):
    monkeypatch.setattr(kv_events, "LOAD_INTERVAL_S", 0.05)
    monkeypatch.setattr(kv_events, "LOAD_HEARTBEAT_S", 1.0)
    load = {"active_blocks": 0, "waiting": 0, "running": 0, "total_blocks": 64}
    received: list[tuple[float, dict]] = []
    watcher = await nats.connect(nats_url)

    async def on_message(msg) -> None:
        received.append((time.monotonic(), orjson.loads(msg.data)))

    await watcher.subscribe(events_subject(DEFAULT_NAMESPACE, "demo", "w1"), cb=on_message)
    await watcher.flush()
    publisher = KvEventPublisher(nats_url, "w1", "demo", load=lambda: dict(load))
    try:
        await publisher.start()
        await asyncio.sleep(1.6)  # 32 ticks: the first report, then one heartbeat
        assert len(received) == 2, [m["seq"] for _, m in received]
        assert received[1][0] - received[0][0] == pytest.approx(1.0, abs=0.3)
        load["running"] = 3
        changed_at = time.monotonic()
        deadline = changed_at + 2
        while len(received) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        at, message = received[2]
        assert message["load"]["running"] == 3 and at - changed_at < 0.5
        assert [m["seq"] for _, m in received] == [1, 2, 3]  # no gap: routers take none for a lost message
    finally:
        await publisher.close()
        await watcher.close()


async def test_a_pushed_load_is_read_only_when_it_moves_or_a_heartbeat_is_due(nats_url, monkeypatch):
    """``load_pushed``: the reader is not polled between heartbeats (an idle process sleeps), and ``load_changed``
    sends the new load on the next tick."""
    monkeypatch.setattr(kv_events, "LOAD_INTERVAL_S", 0.05)
    monkeypatch.setattr(kv_events, "LOAD_HEARTBEAT_S", 1.0)
    load = {"active_blocks": 0, "waiting": 0, "running": 0, "total_blocks": 64}
    reads = []

    def reader() -> dict:
        reads.append(time.monotonic())
        return dict(load)

    received: list[dict] = []
    watcher = await nats.connect(nats_url)

    async def on_message(msg) -> None:
        received.append(orjson.loads(msg.data))

    await watcher.subscribe(events_subject(DEFAULT_NAMESPACE, "demo", "w2"), cb=on_message)
    await watcher.flush()
    publisher = KvEventPublisher(nats_url, "w2", "demo", load=reader, load_pushed=True)
    try:
        await publisher.start()
        await asyncio.sleep(1.6)  # polled, 32 reads; pushed: the first report and one heartbeat
        assert len(reads) <= 3 and len(received) == 2, (len(reads), [m["seq"] for m in received])
        load["running"] = 3
        publisher.load_changed()
        deadline = time.monotonic() + 2
        while len(received) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert received[2]["load"]["running"] == 3
        assert [m["seq"] for m in received] == [1, 2, 3]
    finally:
        await publisher.close()
        await watcher.close()
