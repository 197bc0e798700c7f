"""Sticky sessions and the priority queue for a busy model (nvext.session_control, agent_hints.priority)."""

from __future__ import annotations

import asyncio

import pytest
from meshfront.router.v1 import router_pb2

from services.common.discovery import ModelCard, WorkerCard
from services.common.errors import ModelNotFound, Overloaded
from services.common.overload import BusyThreshold
from services.router.core.lifecycle import BOOK, LifecycleEvent
from services.router.core.sessions import HARD, SOFT, SessionAffinity
from services.router.service import Router

pytestmark = pytest.mark.unit

CARDS = [WorkerCard(f"w{i}", f"127.0.0.1:{9000 + i}", ModelCard("m", "/tmp")) for i in range(3)]


def req(rid: str, **kw) -> router_pb2.RouteRequest:
    return router_pb2.RouteRequest(request_id=rid, model="m", prompt_tokens=4, **kw)


async def release(router: Router, rid: str) -> None:
    await router.release(router_pb2.ReleaseRequest(request_id=rid))


def test_a_session_sticks_to_its_first_worker_while_others_rotate():
    async def main():
        router = Router(lambda model: CARDS)
        plain = [(await router.route(req(f"p{i}"))).worker_id for i in range(3)]
        assert len(set(plain)) == 3
        sticky = {(await router.route(req(f"s{i}", session_id="chat-1"))).worker_id for i in range(6)}
        assert len(sticky) == 1
        other = {(await router.route(req(f"t{i}", session_id="chat-2"))).worker_id for i in range(6)}
        assert len(other) == 1
    asyncio.run(main())


def test_a_closed_session_or_a_gone_worker_ends_the_binding():
    async def main():
        router = Router(lambda model: CARDS)
        first = (await router.route(req("a", session_id="s", session_action="close"))).worker_id
        assert router.sessions.worker_for("s") == first  # close waits for the request to end
        await release(router, "a")
        assert router.sessions.worker_for("s") is None
        bound = (await router.route(req("b", session_id="s2"))).worker_id
        router.on_worker_change(bound, None)
        assert router.sessions.worker_for("s2") is None
    asyncio.run(main())


def test_a_busy_sessions_worker_is_passed_over_without_losing_the_session():
    async def main():
        router = Router(lambda model: CARDS, busy=BusyThreshold(1))
        home = (await router.route(req("a", session_id="s"))).worker_id
        elsewhere = (await router.route(req("b", session_id="s"))).worker_id  # home is busy, no queue
        assert elsewhere != home and router.sessions.worker_for("s") == home
        await release(router, "a")
        assert (await router.route(req("c", session_id="s"))).worker_id == home
    asyncio.run(main())


def test_sessions_expire_and_replicas_learn_bindings_from_book_events():
    now = [0.0]
    sessions = SessionAffinity(clock=lambda: now[0])
    sessions.bind("s", "w1", 10)
    now[0] = 9.9
    assert sessions.worker_for("s") == "w1"
    sessions.bind("s", "w2")  # renewed, keeps its worker and timeout
    now[0] = 19.8
    assert sessions.worker_for("s") == "w1"
    now[0] = 20.0
    assert sessions.worker_for("s") is None
    replica = Router(lambda model: CARDS)
    replica.apply(LifecycleEvent(BOOK, "r", "w2", "m", session_id="remote"), remote=True)
    assert asyncio.run(replica.route(req("x", session_id="remote"))).worker_id == "w2"


def test_waiting_requests_are_served_by_priority_then_arrival():
    async def main():
        router = Router(lambda model: CARDS[:1], busy=BusyThreshold(1), queue_timeout_s=5)
        await router.route(req("running"))
        order: list[str] = []

        async def wait(rid: str, jump: float) -> None:
            r = await router.route(req(rid, priority_jump_s=jump))
            order.append(rid)
            assert r.queue_depth >= 1
            await asyncio.sleep(0)
            await release(router, rid)

        tasks = []
        for rid, jump in (("low-1", 0), ("low-2", 0), ("urgent", 60), ("mid", 0.5)):
            tasks.append(asyncio.create_task(wait(rid, jump)))
            await asyncio.sleep(0.01)
        assert router.queue.waiting("m") == 4 and router.queue.depths() == {"m": 4}
        await release(router, "running")
        await asyncio.gather(*tasks)
        assert order == ["urgent", "mid", "low-1", "low-2"]
    asyncio.run(main())


def test_a_waiter_times_out_with_overloaded_and_frees_nothing_it_did_not_get():
    async def main():
        router = Router(lambda model: CARDS[:1], busy=BusyThreshold(1), queue_timeout_s=0.05)
        await router.route(req("running"))
        with pytest.raises(Overloaded, match="stayed busy"):
            await router.route(req("late"))
        assert router.queue.waiting("m") == 0 and router.bookings.in_flight("w0") == 1
    asyncio.run(main())


def test_without_a_queue_a_busy_model_still_fails_at_once():
    async def main():
        router = Router(lambda model: CARDS[:1], busy=BusyThreshold(1))
        await router.route(req("running"))
        with pytest.raises(Overloaded):
            await router.route(req("now"))
    asyncio.run(main())


def test_waiters_fail_when_the_model_goes_away():
    async def main():
        cards = list(CARDS[:1])
        router = Router(lambda model: cards, busy=BusyThreshold(1), queue_timeout_s=5)
        await router.route(req("running"))
        waiter = asyncio.create_task(router.route(req("w")))
        await asyncio.sleep(0.01)
        cards.clear()
        router.on_worker_change("w0", None)
        with pytest.raises(ModelNotFound):
            await waiter
    asyncio.run(main())


def header_router(mode: str, ttl_s: int = 60, clock=None, **kw) -> Router:
    """A router with Dynamo's header session affinity on (--router-session-affinity-ttl-secs, -mode)."""
    router = Router(lambda model: CARDS, **kw)
    router.sessions = SessionAffinity(clock=clock or (lambda: 0.0), affinity_ttl_s=ttl_s, mode=mode)
    return router


def test_a_header_session_binds_only_while_header_affinity_is_on():
    async def main():
        off = Router(lambda model: CARDS)  # Meshfront's default, as Dynamo's with the TTL omitted: ignored
        assert len({(await off.route(req(f"o{i}", affinity_session_id="h"))).worker_id for i in range(3)}) == 3
        assert len(off.sessions) == 0
        on = header_router(SOFT)
        assert len({(await on.route(req(f"n{i}", affinity_session_id="h"))).worker_id for i in range(4)}) == 1
        # nvext.session_control's key wins over the header's when both are given
        mixed = (await on.route(req("m", session_id="sc", affinity_session_id="h"))).worker_id
        assert on.sessions.worker_for("sc") == mixed and on.sessions.worker_for("h") is not None
    asyncio.run(main())


def test_a_header_session_lives_for_the_affinity_ttl_renewed_by_each_request():
    async def main():
        now = [0.0]
        router = header_router(SOFT, ttl_s=10, clock=lambda: now[0])
        home = (await router.route(req("a", affinity_session_id="h"))).worker_id
        now[0] = 9.0
        assert (await router.route(req("b", affinity_session_id="h"))).worker_id == home  # renewed until 19
        now[0] = 18.9
        assert router.sessions.worker_for("h") == home
        now[0] = 19.0
        assert router.sessions.worker_for("h") is None  # expired: the next request binds afresh
        rebound = (await router.route(req("c", affinity_session_id="h"))).worker_id
        assert router.sessions.worker_for("h") == rebound
    asyncio.run(main())


def test_soft_affinity_passes_a_busy_worker_over_and_hard_affinity_does_not():
    async def main():
        soft = header_router(SOFT, busy=BusyThreshold(1), queue_timeout_s=5)
        home = (await soft.route(req("a", affinity_session_id="h"))).worker_id
        moved = await asyncio.wait_for(soft.route(req("b", affinity_session_id="h")), 1)  # no wait for home
        assert moved.worker_id != home and soft.sessions.worker_for("h") == home

        hard = header_router(HARD, busy=BusyThreshold(1))  # no queue: a 503 at once
        home = (await hard.route(req("a", affinity_session_id="h"))).worker_id
        with pytest.raises(Overloaded, match="session 'h' is busy"):
            await hard.route(req("b", affinity_session_id="h"))
        assert hard.bookings.in_flight(home) == 1 and len(hard.bookings) == 1  # nothing booked elsewhere

        queued = header_router(HARD, busy=BusyThreshold(1), queue_timeout_s=5)  # a queue: it waits for home
        home = (await queued.route(req("a", affinity_session_id="h"))).worker_id
        waiter = asyncio.create_task(queued.route(req("b", affinity_session_id="h")))
        await asyncio.sleep(0.01)
        assert not waiter.done() and queued.queue.waiting("m") == 1
        await release(queued, "a")
        assert (await waiter).worker_id == home
    asyncio.run(main())


def test_a_migration_leaves_a_hard_sessions_failed_worker():
    async def main():
        router = header_router(HARD)
        home = (await router.route(req("a", affinity_session_id="h"))).worker_id
        await release(router, "a")
        moved = await router.route(req("a", affinity_session_id="h", exclude_worker_ids=[home]))
        assert moved.worker_id != home
    asyncio.run(main())


def test_affinity_flags_take_dynamos_names_and_env_twins():
    from services.router.config import parse_config

    cfg = parse_config([], {"DYN_ROUTER_SESSION_AFFINITY_TTL_SECS": "600", "DYN_ROUTER_SESSION_AFFINITY_MODE": "hard"})
    assert (cfg.router_session_affinity_ttl_secs, cfg.router_session_affinity_mode) == (600, HARD)
    defaults = parse_config([], {})
    assert (defaults.router_session_affinity_ttl_secs, defaults.router_session_affinity_mode) == (0, SOFT)
    with pytest.raises(ValueError, match="--router-session-affinity-ttl-secs -1 must be between 1 and 31536000"):
        parse_config(["--router-session-affinity-ttl-secs", "-1"], {})
    with pytest.raises(SystemExit) as exit_:
        parse_config(["--router-session-affinity-mode", "sticky"], {})
    assert exit_.value.code == 2
