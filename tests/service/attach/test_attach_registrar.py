"""meshfront attach against an in-test engine serving SMG's VllmEngine service (we ship no engine) and a real
nats-server: the card goes out with the same TTL and heartbeat as a worker's, leaves when the engine's health fails
and comes back with it, and the engine's KV events and load arrive in the routers' format, our block hashes."""

from __future__ import annotations

import asyncio

import grpc
import orjson
import pytest
from smg_grpc_proto.generated import common_pb2, vllm_engine_pb2, vllm_engine_pb2_grpc

from services.common.discovery import DEFAULT_TTL_S, WorkerRegistry, open_bucket
from services.common.hashing import block_hashes, sequence_hashes
from services.common.kv_events import events_subject
from services.common.namespace import Namespace
from services.common.nats_connection import connect
from services.workers.attach import link as attach_link
from services.workers.attach.core import VLLM_ENGINE, AttachSettings
from services.workers.attach.link import EngineLink
from services.workers.attach.main import Fleet, resolve
from tests.conftest import wait_for

pytestmark = [pytest.mark.service, pytest.mark.timeout(90)]

BS = 4


class FakeEngine(vllm_engine_pb2_grpc.VllmEngineServicer):
    """Answers as `vllm serve --grpc` does, with what the test scripts: health, info, loads, KV event batches."""

    def __init__(self, model_dir: str):
        self.model_dir = model_dir
        self.healthy = True
        self.batches: asyncio.Queue[common_pb2.KvEventBatch] = asyncio.Queue()
        self.subscriptions = 0
        self.loads_asked = 0

    async def HealthCheck(self, request, context):
        return vllm_engine_pb2.HealthCheckResponse(healthy=self.healthy, message="" if self.healthy else "wedged")

    async def GetModelInfo(self, request, context):
        return vllm_engine_pb2.GetModelInfoResponse(served_model_name="tiny-engine", model_path=self.model_dir,
                                                    max_context_length=256, is_generation=True)

    async def GetServerInfo(self, request, context):
        return vllm_engine_pb2.GetServerInfoResponse(block_size=BS, data_parallel_size=1, server_type="vllm-grpc")

    async def GetLoads(self, request, context):
        self.loads_asked += 1
        return vllm_engine_pb2.GetLoadsResponse(loads=[vllm_engine_pb2.SchedulerLoad(
            num_running_reqs=2, num_waiting_reqs=1, token_usage=0.5, max_total_num_tokens=400)])

    async def SubscribeKvEvents(self, request, context):
        self.subscriptions += 1
        while True:
            yield await self.batches.get()


def stored(hashes, parent, tokens) -> common_pb2.KvCacheEvent:
    blocks = [common_pb2.KvBlock(block_hash=h, token_ids=tokens[i * BS:(i + 1) * BS], block_size=BS)
              for i, h in enumerate(hashes)]
    event = common_pb2.KvBlocksStored(blocks=blocks)
    if parent is not None:
        event.parent_block_hash = parent
    return common_pb2.KvCacheEvent(stored=event)


async def serving(demo_model_dir) -> tuple[FakeEngine, grpc.aio.Server, int]:
    """A fake vLLM engine serving on a free loopback port: (engine, server, port)."""
    engine = FakeEngine(str(demo_model_dir))
    server = grpc.aio.server()
    vllm_engine_pb2_grpc.add_VllmEngineServicer_to_server(engine, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return engine, server, port


async def registered(registry: WorkerRegistry, link: EngineLink):
    """Starts both and waits for the engine's card: the card."""
    await registry.start()
    await link.start()
    await wait_for(lambda: registry.workers_for("tiny-engine"), 20, "the engine's card")
    return registry.workers_for("tiny-engine")[0]


async def test_attach_registers_relays_and_follows_health(nats_url, demo_model_dir):
    engine, server, port = await serving(demo_model_dir)
    address = f"127.0.0.1:{port}"
    settings = AttachSettings(protocol=VLLM_ENGINE, namespace="attach1", tool_call_parser="hermes")
    link = EngineLink(address, settings, nats_url, check_every_s=0.2)
    registry = WorkerRegistry(nats_url, "test-attach")
    nc = await connect(nats_url, "test-attach-events")
    messages: list[dict] = []
    try:
        card = await registered(registry, link)
        assert (card.address, card.engine_protocol, card.namespace) == (address, VLLM_ENGINE, "attach1")
        assert (card.model.block_size, card.model.context_length, card.total_kv_blocks) == (BS, 256, 100)
        assert card.model.tool_call_parser == "hermes" and card.model.model_files

        # The heartbeat: the same Registrar, TTL and period as a worker's; the card is put again within a third.
        assert link.registrar is not None and link.registrar.ttl_s == DEFAULT_TTL_S
        kv = await open_bucket(nc)
        first = (await kv.get(link.registrar.key)).revision
        await wait_for(lambda: link.registrar is not None and link.registrar._published >= 2, DEFAULT_TTL_S, "a beat")
        assert (await kv.get(link.registrar.key)).revision > first

        async def take(msg) -> None:
            messages.append(orjson.loads(msg.data))

        sub = await nc.subscribe(events_subject(Namespace("attach1"), "tiny-engine", card.worker_id), cb=take)
        await nc.flush()  # the server has the subscription before anything is relayed (a loaded machine lost it)
        await wait_for(lambda: engine.subscriptions == 1, 10, "the KV event subscription")
        tokens = list(range(200, 212))
        await engine.batches.put(common_pb2.KvEventBatch(sequence_number=1, events=[
            stored([-11, 12], None, tokens[:8]), stored([13], 12, tokens[8:])]))
        await wait_for(lambda: any(m["events"] for m in messages), 10, "the relayed KV events")
        events = [e for m in messages for e in m["events"]]
        relayed = [b["block_hash"] for e in events for b in e["stored"]["blocks"]]
        assert relayed == sequence_hashes(block_hashes(tokens, BS))  # what the preprocessor hashes a prompt to
        await wait_for(lambda: any(m.get("load", {}).get("running") == 2 for m in messages), 10, "the load")
        load = next(m["load"] for m in messages if m.get("load", {}).get("running") == 2)
        assert load == {"active_blocks": 50, "waiting": 1, "running": 2, "total_blocks": 100}
        await sub.unsubscribe()

        engine.healthy = False
        await wait_for(lambda: not registry.workers_for("tiny-engine"), 10, "the card to leave")
        engine.healthy = True
        await wait_for(lambda: registry.workers_for("tiny-engine"), 10, "the card to come back")
        assert registry.workers_for("tiny-engine")[0].worker_id == card.worker_id
    finally:
        await link.close()
        await registry.close()
        await nc.close()
        await server.stop(0)


async def test_a_dns_answer_without_the_engine_detaches_it(nats_url, demo_model_dir):
    """What --engine-dns does with each answer: a new address attached, a gone one's card purged at once."""
    _, server, port = await serving(demo_model_dir)
    found = await resolve(f"localhost:{port}")
    assert found is not None and f"127.0.0.1:{port}" in found
    fleet = Fleet(AttachSettings(protocol=VLLM_ENGINE, namespace="attach2"), nats_url)
    registry = WorkerRegistry(nats_url, "test-attach-dns")
    try:
        await registry.start()
        await fleet.follow([f"127.0.0.1:{port}"])
        await wait_for(lambda: registry.workers_for("tiny-engine"), 20, "the engine's card")
        await fleet.follow([])
        assert not fleet.links
        await wait_for(lambda: not registry.workers_for("tiny-engine"), 5, "the card to be purged")
    finally:
        await fleet.close()
        await registry.close()
        await server.stop(0)


async def test_a_stamped_stream_is_not_polled_and_a_broken_one_is_checked_at_once(nats_url, demo_model_dir,
                                                                                  monkeypatch):
    """A servicer whose batches carry the load record is asked for GetLoads once (its KV capacity, at
    registration): the record's load goes out, no poll. An engine that goes away breaks the stream, which brings
    the health check forward: the card leaves long before the next scheduled check."""
    monkeypatch.setattr(attach_link, "LOADS_EVERY_S", 0.05)  # a poll, were there one, would ask many times
    engine, server, port = await serving(demo_model_dir)
    address = f"127.0.0.1:{port}"
    link = EngineLink(address, AttachSettings(protocol=VLLM_ENGINE, namespace="attach3"), nats_url,
                      check_every_s=60.0)
    registry = WorkerRegistry(nats_url, "test-attach-stamped")
    nc = await connect(nats_url, "test-attach-stamped-events")
    messages: list[dict] = []
    try:
        card = await registered(registry, link)

        async def take(msg) -> None:
            messages.append(orjson.loads(msg.data))

        await nc.subscribe(events_subject(Namespace("attach3"), "tiny-engine", card.worker_id), cb=take)
        await nc.flush()
        await wait_for(lambda: engine.subscriptions == 1, 10, "the KV event subscription")
        record = common_pb2.EngineLoad(running_requests=3, waiting_requests=0, token_usage=0.25)
        await engine.batches.put(common_pb2.KvEventBatch(sequence_number=1, events=[
            stored([21], None, list(range(300, 304)))], load=record))
        await wait_for(lambda: any(m.get("load", {}).get("running") == 3 for m in messages), 10, "the record's load")
        load = next(m["load"] for m in messages if m.get("load", {}).get("running") == 3)
        assert load == {"active_blocks": 25, "waiting": 0, "running": 3, "total_blocks": 100}
        # a record alone (no events) moves the load too, and nothing asked GetLoads after registration
        await engine.batches.put(common_pb2.KvEventBatch(sequence_number=1, load=common_pb2.EngineLoad()))
        await wait_for(lambda: messages[-1].get("load", {}).get("running") == 0, 10, "the idle record's load")
        assert engine.loads_asked == 1

        await server.stop(0)  # the engine's process is gone: its stream breaks, the check follows at once
        await wait_for(lambda: not registry.workers_for("tiny-engine"), 10, "the card to leave")
    finally:
        await link.close()
        await registry.close()
        await nc.close()
        await server.stop(0)
