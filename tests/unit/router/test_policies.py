import random

import pytest

from services.common.errors import InvalidRequest, NoWorkers
from services.router.assembly import build_router
from services.router.core.bookings import Bookings
from services.router.core.kv_ingest import KvEventIngest
from services.router.core.policies import KvSettings, build_policy, kv_policy
from services.router.core.policies.kv_aware import KvAware
from services.router.core.policies.random_choice import RandomChoice
from services.router.core.types import Candidate, RouteQuery

pytestmark = pytest.mark.unit

Q = RouteQuery("r1", "m")


def cands(*loads):
    return [Candidate(f"w{i}", f"127.0.0.1:{9000 + i}", in_flight=load) for i, load in enumerate(loads)]


def test_round_robin_cycles_in_id_order_regardless_of_input_order():
    policy = build_policy("round-robin")
    cs = cands(0, 0, 0)
    picks = [policy.choose(list(reversed(cs)), Q).worker_id for _ in range(6)]
    assert picks == ["w0", "w1", "w2", "w0", "w1", "w2"]


def test_random_uses_injected_rng_and_covers_all():
    policy = RandomChoice(rng=random.Random(7))
    picks = {policy.choose(cands(0, 0, 0), Q).worker_id for _ in range(100)}
    assert picks == {"w0", "w1", "w2"}


def test_least_loaded_picks_min_and_rotates_ties():
    policy = build_policy("least-loaded")
    assert policy.choose(cands(3, 1, 2), Q).worker_id == "w1"
    picks = [policy.choose(cands(1, 0, 0), Q).worker_id for _ in range(4)]
    assert sorted(set(picks)) == ["w1", "w2"]


def test_direct_needs_a_pin_and_a_known_worker():
    policy = build_policy("direct")
    with pytest.raises(InvalidRequest):
        policy.choose(cands(0, 0), Q)
    with pytest.raises(NoWorkers):
        policy.choose(cands(0, 0), RouteQuery("r", "m", pinned_worker_id="w9"))
    assert policy.choose(cands(0, 0), RouteQuery("r", "m", pinned_worker_id="w1")).worker_id == "w1"


def test_unknown_policy_name_lists_choices():
    with pytest.raises(ValueError, match="round-robin"):
        build_policy("fastest")


def test_kv_is_not_built_apart_from_its_router():
    """A kv policy that its router does not tell about bookings would weigh no load: build_router wires it."""
    with pytest.raises(ValueError, match="build_router"):
        build_policy("kv")
    router = build_router(lambda _m: [], "kv")
    assert router.kv is router.policy and router.listeners[0] is router.kv and router.shares_load


async def test_a_policy_is_a_class_with_choose_and_reads_load():
    """The recipe in services/router/README.md: a new policy needs nothing else to route."""
    from meshfront.router.v1 import router_pb2

    from services.common.discovery import ModelCard, WorkerCard
    from services.router.core.types import Decision
    from services.router.service import Router

    class FewestPromptTokens:
        reads_load = True

        def choose(self, candidates, query):
            return Decision(min(candidates, key=lambda c: (c.booked_prompt_tokens, c.worker_id)).worker_id)

    cards = [WorkerCard(w, "127.0.0.1:1", ModelCard("m", "/m")) for w in ("w0", "w1")]
    router = Router(lambda _m: cards, FewestPromptTokens())
    picks = [(await router.route(router_pb2.RouteRequest(request_id=r, model="m", prompt_tokens=n))).worker_id
             for r, n in (("a", 100), ("b", 10), ("c", 10))]
    assert picks == ["w0", "w1", "w1"] and router.shares_load and router.kv is None


def test_bookings_count_release_idempotent_and_drop_worker():
    b = Bookings()
    b.book("a", "w0", 100)
    b.book("b", "w0", 50)
    b.book("c", "w1", 10)
    assert (b.in_flight("w0"), b.prompt_tokens("w0")) == (2, 150)
    assert b.release("a") and not b.release("a")
    assert (b.in_flight("w0"), b.prompt_tokens("w0")) == (1, 50)
    b.drop_worker("w0")
    assert b.in_flight("w0") == 0 and len(b) == 1


async def test_only_request_tracking_policies_ask_for_the_first_token_report():
    from meshfront.router.v1 import router_pb2

    from services.common.discovery import ModelCard, WorkerCard

    cards = [WorkerCard("w0", "127.0.0.1:1", ModelCard("m", "/m"))]
    for mode, wanted in (("round-robin", False), ("least-loaded", False), ("kv", True)):
        r = await build_router(lambda _m: cards, mode).route(router_pb2.RouteRequest(request_id="r", model="m"))
        assert r.report_first_token is wanted, mode
        assert r.reads_first_token_reports  # the gateway may send FirstTokenReport, not the deprecated form


def test_kv_is_built_from_typed_settings_with_the_event_index_or_approximate():
    ingest = KvEventIngest()
    fed = kv_policy(KvSettings(overlap_weight=2.0, temperature=0.5, hotspot_ratio=4.0), ingest)
    ingest.on_message({"worker_id": "w0", "model": "m", "seq": 1, "events": [], "load": {"active_blocks": 7}})
    assert isinstance(fed, KvAware) and fed.index is ingest.index and fed.approximate is None
    assert (fed.overlap_weight, fed.temperature, fed.hotspot_ratio) == (2.0, 0.5, 4.0)
    assert fed.active_blocks("w0") == 7 and fed.active_blocks("w1") == 0  # reports reach the policy
    approximate = kv_policy(KvSettings(ttl_s=9.0))
    assert isinstance(approximate, KvAware) and approximate.approximate is not None
    assert approximate.approximate.ttl_s == 9.0
