"""Routing requests for LoRA adapters (services/router/lora.py): holders only, the adapter limit (wait or
503), and runtime loading on the least-loaded worker that loads adapters."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from meshfront.router.v1 import router_pb2

from services.common.discovery import LoraAdapter, ModelCard, WorkerCard
from services.common.errors import ModelNotFound, Overloaded
from services.router.service import Router

pytestmark = pytest.mark.unit

BASE = "base"


def card(worker: str, adapters: tuple[str, ...] = (), max_loras: int = 1, runtime: bool = False) -> WorkerCard:
    model = ModelCard(BASE, "/m", lora_adapters=tuple(LoraAdapter(a, f"/a/{a}") for a in adapters))
    return WorkerCard(worker, f"{worker}:1", model, max_loras=max_loras, lora_runtime_loading=runtime)


class Fleet:
    """A discovery view: base model and adapter names -> cards, as WorkerRegistry indexes them."""

    def __init__(self, cards: list[WorkerCard]):
        self.cards = cards

    def __call__(self, model: str) -> list[WorkerCard]:
        return [c for c in self.cards if c.model.name == model or any(a.name == model for a in c.model.lora_adapters)]


def req(rid: str, model: str) -> router_pb2.RouteRequest:
    return router_pb2.RouteRequest(request_id=rid, model=model, prompt_tokens=4)


def route(router: Router, rid: str, model: str) -> str:
    return asyncio.run(router.route(req(rid, model))).worker_id


def test_an_adapter_goes_only_to_workers_holding_it():
    router = Router(Fleet([card("h0", ("ada",), 4), card("h1", ("ada",), 4), card("plain"), card("other", ("bob",))]))
    assert {route(router, f"r{i}", "ada") for i in range(8)} == {"h0", "h1"}
    assert route(router, "b", "bob") == "other"
    with pytest.raises(ModelNotFound):
        route(router, "x", "nobody-holds-this")


def test_a_worker_runs_at_most_max_loras_adapters_then_503():
    router = Router(Fleet([card("h0", ("ada", "bob", "cid"), max_loras=2)]))
    route(router, "a1", "ada")
    route(router, "b1", "bob")
    assert route(router, "a2", "ada") == "h0"  # ada runs there already: no new slot needed
    with pytest.raises(Overloaded, match="max_loras"):
        route(router, "c1", "cid")
    asyncio.run(router.release(router_pb2.ReleaseRequest(request_id="b1")))
    assert route(router, "c2", "cid") == "h0"  # bob's slot is free again
    assert route(router, "base", BASE) == "h0"  # the base model takes no adapter slot


def test_with_a_queue_a_request_waits_for_an_adapter_slot():
    async def main():
        router = Router(Fleet([card("h0", ("ada", "bob"))]), queue_timeout_s=5)
        await router.route(req("a", "ada"))
        waiting = asyncio.create_task(router.route(req("b", "bob")))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await router.release(router_pb2.ReleaseRequest(request_id="a"))
        routed = await asyncio.wait_for(waiting, 2)
        assert routed.worker_id == "h0" and routed.queue_depth == 1
    asyncio.run(main())


def test_runtime_loading_takes_the_least_loaded_loader_when_no_holder_can():
    router = Router(Fleet([card("h0", ("ada", "bob")), card("l0", runtime=True), card("l1", runtime=True),
                           card("fixed")]))
    assert route(router, "a", "ada") == "h0"
    asyncio.run(router.route(router_pb2.RouteRequest(request_id="base", model=BASE, prompt_tokens=4, worker_id="l0")))
    # h0 runs ada (its one slot); bob goes to the loader with nothing in flight, never to "fixed", which
    # does not load adapters at runtime.
    assert route(router, "b", "bob") == "l1"
    assert router.lora.decisions == {("ada", "held"): 1, ("bob", "runtime_load"): 1}


def test_a_loader_that_took_an_adapter_is_a_holder_once_its_card_says_so():
    fleet = Fleet([card("h0", ("ada", "bob")), card("l0", runtime=True)])
    router = Router(fleet)
    route(router, "a", "ada")
    assert route(router, "b", "bob") == "l0"
    fleet.cards[1] = dataclasses.replace(fleet.cards[1], model=dataclasses.replace(
        fleet.cards[1].model, lora_adapters=(LoraAdapter("bob", "/a/bob"),)))
    router.on_worker_change("l0", fleet.cards[1])
    assert route(router, "b2", "bob") == "l0"
    assert router.lora.decisions[("bob", "held")] == 1
    router.on_worker_change("l0", None)  # gone: its running adapters are forgotten with it
    fleet.cards.pop()
    assert "l0" not in router.lora._running
