"""KV events over a real NATS: a mocker KV cache publishes, routers' indexes follow, gaps resync,
workers that come and go are picked up and dropped, and router replicas share bookings."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from services.common.discovery import ModelCard, WorkerCard
from services.common.hashing import block_hashes
from services.router.assembly import build_router
from services.router.core.kv_ingest import KvEventIngest
from services.router.core.lifecycle import LifecycleEvent
from services.router.core.policies import build_policy
from services.router.events import KvEventSubscriber, ReplicaSync
from services.router.service import Router
from services.workers.kv_events import KvEventPublisher
from services.workers.mocker.kv_cache import KvCache
from services.workers.mocker.sequence import full_blocks
from tests.conftest import wait_for

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]

BS = 16


def card(worker_id: str) -> WorkerCard:
    return WorkerCard(worker_id, "127.0.0.1:1", ModelCard("m", "/m", block_size=BS))


def tokens(seed: int, n: int = 8 * BS) -> list[int]:
    return [(seed * 7919 + i * 31) % 50_000 for i in range(n)]


class FakeWorker:
    """The mocker's real KvCache with the real publisher attached (no engine needed)."""

    def __init__(self, nats_url: str, worker_id: str, blocks: int = 64):
        self.id = worker_id
        self.publisher = KvEventPublisher(nats_url, worker_id, "m")
        self.cache = KvCache(blocks, BS, self.publisher)

    def run(self, toks: list[int]) -> None:
        """Prefill then finish a sequence: its blocks stay cached (LRU) afterwards."""
        blocks = full_blocks(toks, BS)
        assert self.cache.allocate(blocks, None)
        self.cache.release([b.block_hash for b in blocks])


class RouterSide:
    def __init__(self, nats_url: str, known: set[str]):
        self.ingest = KvEventIngest()
        self.sub = KvEventSubscriber(nats_url, self.ingest, known.__contains__)

    def matches(self, toks: list[int]) -> dict[str, int]:
        return self.ingest.index.find_matches(block_hashes(toks, BS))


async def test_events_drive_index_gap_resync_join_and_leave(nats_url):
    known = {"w1"}
    w1 = FakeWorker(nats_url, "w1")
    w1.run(tokens(1))  # before anyone listens: only the dump can tell
    await w1.publisher.start()
    await asyncio.wait_for(w1.publisher.connected.wait(), 10)
    router = RouterSide(nats_url, known)
    await router.sub.start()
    router.sub.on_worker_change("w1", card("w1"))
    await wait_for(lambda: router.matches(tokens(1)) == {"w1": 8}, 5, "the dump")
    w1.run(tokens(2))
    await wait_for(lambda: router.matches(tokens(2)) == {"w1": 8}, 5, "live stored events")
    # Evictions: fill the 64-block cache with new prompts until tokens(1) is gone.
    for s in range(3, 12):
        w1.run(tokens(s))
    await wait_for(lambda: router.matches(tokens(1)) == {}, 5, "removed events")

    # A lost message: the router sees the gap and reloads the full block set.
    w1.publisher.seq += 1
    w1.run(tokens(20))
    await wait_for(lambda: router.ingest.stats.gaps == 1 and router.matches(tokens(20)) == {"w1": 8}, 5,
                   "gap recovery")
    assert router.ingest.stats.dumps_loaded == 2
    expected = {h for h in (b.block_hash for s in range(3, 21) for b in full_blocks(tokens(s), BS))
                if w1.cache.contains(h)}
    assert router.ingest.index.worker_blocks("w1") == len(expected)

    # A worker that appears gets its full state; one that leaves discovery is dropped at once.
    w2 = FakeWorker(nats_url, "w2")
    w2.run(tokens(1))
    await w2.publisher.start()
    known.add("w2")
    router.sub.on_worker_change("w2", card("w2"))
    await wait_for(lambda: router.matches(tokens(1)) == {"w2": 8}, 5, "the new worker's state")
    known.discard("w1")
    router.sub.on_worker_change("w1", None)
    assert router.ingest.index.worker_blocks("w1") == 0
    w1.run(tokens(21))  # its late events are ignored
    await asyncio.sleep(0.2)
    assert router.matches(tokens(21)) == {}

    # A replica started now warms up from the workers' state and agrees with the first.
    replica = RouterSide(nats_url, known)
    await replica.sub.start()
    replica.sub.on_worker_change("w2", card("w2"))
    await wait_for(lambda: replica.matches(tokens(1)) == router.matches(tokens(1)), 5, "replica warm-up")
    for side in (router, replica):
        await side.sub.close()
    for w in (w1, w2):
        await w.publisher.close()


async def test_replica_sync_shares_bookings(nats_url):
    cards = [card("w0"), card("w1")]
    routers = [build_router(lambda _m: cards, "kv") for _ in range(2)]
    syncs = [ReplicaSync(nats_url, r.apply) for r in routers]
    for r, s in zip(routers, syncs, strict=True):
        await s.start()
        r.listeners.append(s)
    local = tuple(block_hashes(tokens(5), BS))
    routers[0].apply(LifecycleEvent("book", "q1", "w1", "m", local, 128, 0, 0))
    await wait_for(lambda: routers[1].bookings.in_flight("w1") == 1, 15, "the booking on the replica")
    assert routers[1].policy.index.find_matches(local) == {"w1": 8}
    routers[1].apply(LifecycleEvent("free", "q1"))  # the Release went to the other replica
    await wait_for(lambda: routers[0].bookings.in_flight("w1") == 0, 15, "the release on the first")
    # One message each way: NATS does not echo a replica's own booking back to it (each one costs the receiver).
    assert [s.messages_received for s in syncs] == [1, 1]
    for s in syncs:
        await s.close()


async def test_a_booking_goes_at_once_and_a_release_waits_to_ride_with_it(nats_url):
    """Each replica pays for every message the others send (services/router/events.py): fewer, fuller messages."""
    import nats

    from services.common.namespace import DEFAULT_NAMESPACE
    from services.router.events import LIFECYCLE_SUBJECT

    nc = await nats.connect(nats_url)
    messages: list[list[str]] = []

    async def on_message(msg):
        messages.append([(e["kind"], e["request_id"]) for e in orjson.loads(msg.data)])

    await nc.subscribe(DEFAULT_NAMESPACE.subject(LIFECYCLE_SUBJECT), cb=on_message)
    await nc.flush()
    router = Router(lambda _m: [card("w0")], build_policy("round-robin"))
    sync = ReplicaSync(nats_url, router.apply, lazy_flush_s=3600)  # only a booking or close sends the others
    await sync.start()
    router.listeners.append(sync)
    try:
        router.apply(LifecycleEvent("book", "q1", "w0", "m", (), 16))
        await wait_for(lambda: messages == [[("book", "q1")]], 10, "the booking, alone and at once")
        router.apply(LifecycleEvent("first_token", "q1", prompt_tokens=16))
        router.apply(LifecycleEvent("free", "q1"))
        router.apply(LifecycleEvent("book", "q2", "w0", "m", (), 16))
        await wait_for(lambda: len(messages) == 2, 10, "the next booking")
        assert messages[1] == [("first_token", "q1"), ("free", "q1"), ("book", "q2")]
        router.apply(LifecycleEvent("free", "q2"))
    finally:
        await sync.close()  # sends the release still waiting: the others must not hold q2 forever
    await wait_for(lambda: len(messages) == 3, 10, "the release sent at close")
    assert messages[2] == [("free", "q2")]

    timed = ReplicaSync(nats_url, router.apply, lazy_flush_s=0.05)
    await timed.start()
    router.listeners[-1] = timed
    try:
        router.apply(LifecycleEvent("book", "q3", "w0", "m", (), 16))
        router.apply(LifecycleEvent("free", "q3"))
        await wait_for(lambda: len(messages) >= 4 and ("free", "q3") in messages[-1], 10, "the release on its timer")
    finally:
        await timed.close()
        await nc.close()


async def test_busy_threshold_counts_the_bookings_of_every_replica(nats_url):
    """docs/architecture.md (Overload): with replica sync, a worker another replica filled is busy here too."""
    from meshfront.router.v1 import router_pb2

    from services.common.errors import Overloaded
    from services.common.overload import BusyThreshold

    cards = [card("w0")]
    routers = [Router(lambda _m: cards, build_policy("round-robin"), busy=BusyThreshold(2)) for _ in range(2)]
    syncs = [ReplicaSync(nats_url, r.apply) for r in routers]
    for r, s in zip(routers, syncs, strict=True):
        await s.start()
        r.listeners.append(s)
    for rid in ("a", "b"):
        await routers[0].route(router_pb2.RouteRequest(request_id=rid, model="m", prompt_tokens=1))
    await wait_for(lambda: routers[1].bookings.in_flight("w0") == 2, 15, "the bookings on the other replica")
    with pytest.raises(Overloaded):
        await routers[1].route(router_pb2.RouteRequest(request_id="c", model="m", prompt_tokens=1))
    await routers[0].release(router_pb2.ReleaseRequest(request_id="a"))
    await wait_for(lambda: routers[1].bookings.in_flight("w0") == 1, 15, "the release on the other replica")
    routed = await routers[1].route(router_pb2.RouteRequest(request_id="c", model="m", prompt_tokens=1))
    assert routed.worker_id == "w0"
    for s in syncs:
        await s.close()


async def test_a_failing_load_reader_is_logged_on_every_tick_not_taken_for_nats_away(nats_url, caplog):
    worker = FakeWorker(nats_url, "w-broken")

    def broken_load() -> dict:
        raise KeyError("active_blocks")  # a renamed field, say

    worker.publisher.set_load_reader(broken_load)
    await worker.publisher.start()
    try:
        await wait_for(lambda: any("KV events and load failed" in r.getMessage() for r in caplog.records), 10,
                       "the failure logged")
    finally:
        await worker.publisher.close()
    failed = [r for r in caplog.records if "KV events and load failed" in r.getMessage()]
    assert failed[0].exc_info is not None and failed[0].exc_info[0] is KeyError


async def test_a_booking_event_that_does_not_decode_is_said_not_skipped_silently(nats_url, caplog):
    import nats

    router = Router(lambda _m: [card("w0")], build_policy("round-robin"))
    sync = ReplicaSync(nats_url, router.apply)
    await sync.start()
    nc = await nats.connect(nats_url)
    try:
        await nc.publish(sync.subject, b"not json")
        await nc.publish(sync.subject, b'[{"router_id": "router-other", "worker_id": "w0"}]')  # no kind or id
        await nc.publish(sync.subject, b'[{"router_id": "router-other", "kind": "book", "request_id": "q1", '
                                       b'"worker_id": "w0", "prompt_tokens": 16}]')
        await wait_for(lambda: router.bookings.in_flight("w0") == 1, 10, "the good event after the bad ones")
    finally:
        await nc.close()
        await sync.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("is not JSON" in w for w in warnings) and any("does not decode" in w for w in warnings), warnings
