"""Which bookings a router shares with its replicas (services/router/service.py ``Router._replicates``,
services/router/events.py ``ReplicaSync``), and the gauge that shows what each replica holds booked.

The sync's publishing is read from what it queued for NATS (``_outbox``: one entry per event it sends),
with no connection: the service tests (tests/service/router/test_replica_releases.py) run it over NATS.
"""

from __future__ import annotations

import orjson
from meshfront.router.v1 import router_pb2
from prometheus_client import CollectorRegistry

from services.common.discovery import PREFILL, ModelCard, WorkerCard
from services.common.overload import BusyThreshold
from services.router.assembly import build_router
from services.router.core.lifecycle import LifecycleEvent
from services.router.core.policies import build_policy
from services.router.events import ReplicaSync
from services.router.metrics import RouterMetrics
from services.router.service import Router

CARDS = [WorkerCard(f"w{i}", f"127.0.0.1:{i + 1}", ModelCard("m", "/m", block_size=16)) for i in range(2)]


class _Published(ReplicaSync):
    """The sync as the router drives it, keeping what it would publish instead of sending it."""

    def __init__(self, router: Router):
        super().__init__("nats://unused", router.apply)
        self._nc = object()  # type: ignore[assignment]  # "connected": on_lifecycle queues what it would send

    def _flush_soon(self) -> None:
        pass

    def sent(self) -> list[tuple[str, str]]:
        return [(e["kind"], e["request_id"]) for e in map(orjson.loads, self._outbox)]


def _fleet(mode: str = "round-robin", cards=CARDS, **router_kw) -> tuple[Router, _Published]:
    router = build_router(lambda _m: cards, mode, **router_kw)
    sync = _Published(router)
    router.listeners.append(sync)
    return router, sync


async def _serve(router: Router, rid: str, **fields) -> None:
    await router.route(router_pb2.RouteRequest(request_id=rid, model="m", prompt_tokens=16, **fields))
    router.apply(LifecycleEvent("first_token", rid, prompt_tokens=16))
    router.apply(LifecycleEvent("free", rid))


async def test_a_round_robin_router_shares_no_plain_request():
    router, sync = _fleet()
    await _serve(router, "a")
    assert sync.sent() == []


async def test_sessions_migrations_and_load_reading_decisions_are_shared_with_their_whole_life():
    life = lambda rid: [("book", rid), ("first_token", rid), ("free", rid)]  # noqa: E731
    router, sync = _fleet()
    await _serve(router, "s", session_id="chat", session_timeout_s=60)
    await _serve(router, "m", exclude_worker_ids=["w0"])
    assert sync.sent() == life("s") + life("m")
    for mode, kw in (("least-loaded", {}), ("kv", {}), ("round-robin", {"busy": BusyThreshold(8)})):
        router, sync = _fleet(mode, **kw)
        await _serve(router, "x")
        assert sync.sent() == life("x"), mode


async def test_a_model_with_prefill_workers_shares_every_booking():
    cards = [*CARDS, WorkerCard("p0", "127.0.0.1:9", ModelCard("m", "/m", block_size=16), role=PREFILL)]
    router, sync = _fleet(cards=cards)
    await router.route(router_pb2.RouteRequest(request_id="d", model="m", prompt_tokens=16))
    assert ("book", "d") in sync.sent()


async def test_a_booking_another_replica_shared_is_shared_on_when_it_ends_here():
    router, sync = _fleet()
    sync.on_lifecycle(LifecycleEvent("book", "r", "w0", "m", (), 16), remote=True)  # as _on_message applies it
    router.apply(LifecycleEvent("free", "r"))  # the gateway's release came to this replica
    assert sync.sent() == [("free", "r")]


async def test_booked_requests_gauge_shows_what_the_replica_holds():
    registry = CollectorRegistry()
    router = Router(lambda _m: CARDS, build_policy("round-robin"))
    RouterMetrics(registry=registry, booked=router.bookings.per_worker)
    router.apply(LifecycleEvent("book", "a", "w0", "m", (), 16))
    router.apply(LifecycleEvent("book", "b", "w0", "m", (), 16))
    assert registry.get_sample_value("meshfront_router_booked_requests", {"worker": "w0"}) == 2
    router.apply(LifecycleEvent("free", "a"))
    router.apply(LifecycleEvent("free", "b"))
    assert registry.get_sample_value("meshfront_router_booked_requests", {"worker": "w0"}) is None
