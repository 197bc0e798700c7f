"""Warm before ready (services/gateway/warmup.py): the gateway is ready once every worker it knows has
answered one pinned request through the pipeline, or given up."""

from __future__ import annotations

import asyncio

import pytest

from services.common.discovery import BOTH, DECODE, PREFILL, ModelCard, WorkerCard
from services.common.errors import InvalidRequest, NoWorkers
from services.gateway import warmup as warmup_module
from services.gateway.core.trace import RouteHints
from services.gateway.warmup import Warmup

pytestmark = pytest.mark.unit


NO_HINTS = RouteHints()


class Registry:
    """What Warmup reads of a WorkerRegistry: listeners and the first-view event."""

    def __init__(self) -> None:
        self.listeners = []
        self.synced = asyncio.Event()

    def subscribe(self, listener) -> None:
        self.listeners.append(listener)

    def register(self, worker_id: str, model: str = "m", endpoints=("chat", "completions"), role=BOTH) -> None:
        card = WorkerCard(worker_id, "127.0.0.1:1", ModelCard(model, "/m", endpoints=endpoints), role=role)
        for listener in self.listeners:
            listener(worker_id, card)


class Pipeline:
    """Records each warm-up request; ``gate`` holds them, ``failures`` scripts errors per call."""

    def __init__(self, failures=()) -> None:
        self.calls: list[tuple[str, str]] = []  # (worker pinned, prompt kind)
        self.prefill_pins: list[str] = []
        self.decode_pins: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.failures = list(failures)

    async def run(self, requests, n, worker_id="", hints=NO_HINTS, *, options):
        [req] = requests
        self.calls.append((worker_id, req.WhichOneof("prompt")))
        self.prefill_pins.append(hints.prefill_worker_id)
        self.decode_pins.append(hints.decode_worker_id)
        await self.gate.wait()
        if self.failures:
            raise self.failures.pop(0)
        yield []


async def test_ready_waits_for_every_known_worker_pinned_one_by_one():
    registry, pipeline = Registry(), Pipeline()
    pipeline.gate.clear()
    w = Warmup(pipeline, registry)
    runner = asyncio.create_task(w.run())
    registry.register("w1")
    registry.synced.set()
    registry.register("w2")  # registers while the first is still warming
    await asyncio.sleep(0.2)
    assert not w.ready.is_set() and w.warming == ["w1", "w2"]
    pipeline.gate.set()
    await asyncio.wait_for(runner, 2)
    assert w.ready.is_set() and w.warming == []
    assert sorted(pipeline.calls) == [("w1", "messages_json"), ("w2", "messages_json")]
    registry.register("w1")  # a card refresh of a warm worker does not warm it again
    await asyncio.sleep(0)
    assert len(pipeline.calls) == 2


async def test_a_model_without_chat_warms_with_a_completion_and_retries_what_is_transient():
    registry = Registry()
    pipeline = Pipeline([InvalidRequest("no chat template; use /v1/completions"), NoWorkers("not yet")])
    w = Warmup(pipeline, registry, retry_s=0.01)
    registry.register("w1")
    registry.synced.set()
    await asyncio.wait_for(w.run(), 2)
    assert pipeline.calls == [("w1", "messages_json"), ("w1", "text"), ("w1", "text")]


async def test_a_worker_that_never_warms_does_not_hold_readiness_past_the_deadline():
    registry = Registry()
    w = Warmup(Pipeline([NoWorkers("gone")] * 1000), registry, retry_s=0.01, deadline_s=0.1)
    registry.register("w1")
    registry.synced.set()
    await asyncio.wait_for(w.run(), 2)
    assert w.ready.is_set()


async def test_an_empty_mesh_is_ready_after_a_while_and_embedding_workers_need_no_request():
    registry, pipeline = Registry(), Pipeline()
    w = Warmup(pipeline, registry, empty_wait_s=0.1)
    registry.synced.set()
    await asyncio.wait_for(w.run(), 2)
    assert w.ready.is_set()
    w2 = Warmup(pipeline, registry)
    registry.register("e1", "embed", endpoints=("embeddings",))
    await asyncio.wait_for(w2.run(), 2)
    assert pipeline.calls == []


@pytest.mark.parametrize(("context_length", "ordinary"), [(4096, True), (512, False), (0, False)])
def test_the_warm_up_request_has_an_ordinary_size_where_the_window_allows(context_length, ordinary):
    """A real request's size warms every process's path for it; a small or unknown window gets one token."""
    model = ModelCard("m", "/m", context_length=context_length)
    chat, completion = warmup_module._request(model, "chat"), warmup_module._request(model, "completions")
    assert len(chat.messages_json) > 1000 if ordinary else '"Hi"' in chat.messages_json
    assert (completion.text == warmup_module.WARM_PROMPT) is ordinary
    max_tokens = warmup_module.WARM_TOKENS if ordinary else 1
    assert chat.request.stop.max_tokens == completion.request.stop.max_tokens == max_tokens


async def test_prefill_and_decode_workers_warm_in_their_own_leg_of_a_split_request():
    """A prefill worker never runs a request whole (pinned by backend_instance_id, the router would refuse it),
    and an SGLang decode worker cannot: each is pinned as its leg's worker, the router picks the other."""
    registry, pipeline = Registry(), Pipeline()
    w = Warmup(pipeline, registry)
    registry.register("p1", role=PREFILL)
    registry.register("d1", role=DECODE)
    registry.register("b1", role=BOTH)
    registry.synced.set()
    await asyncio.wait_for(w.run(), 2)
    assert sorted(zip(pipeline.calls, pipeline.prefill_pins, pipeline.decode_pins, strict=True)) == [
        (("", "messages_json"), "", "d1"), (("", "messages_json"), "p1", ""), (("b1", "messages_json"), "", "")]
