"""Disaggregation in the router process's own assembly, over a real NATS and gRPC: workers register their
roles, both pools' KV events feed one index (the prefill worker that caches a prompt prefills it; the decode
worker that caches it keeps it aggregated), pins are checked by role, and decisions are counted by reason."""

from __future__ import annotations

import grpc
import pytest
from meshfront.router.v1 import router_pb2, router_pb2_grpc
from prometheus_client import CollectorRegistry

from services.common.discovery import DECODE, PREFILL, ModelCard, Registrar, WorkerCard, WorkerRegistry
from services.common.errors import InvalidRequest, from_rpc_error
from services.common.grpc_server import GrpcServer
from services.common.hashing import block_hashes
from services.router.assembly import build
from services.router.config import parse_config
from services.router.server import RouterServicer
from services.workers.kv_events import KvEventPublisher
from services.workers.mocker.kv_cache import KvCache
from services.workers.mocker.sequence import full_blocks
from tests.conftest import wait_for

pytestmark = [pytest.mark.service, pytest.mark.timeout(90)]

BS = 16
ROLES = {"p1": PREFILL, "p2": PREFILL, "d1": DECODE, "d2": DECODE}


def tokens(seed: int, blocks: int = 8) -> list[int]:
    return [(seed * 7919 + i * 31) % 50_000 for i in range(blocks * BS)]


class Worker:
    """A registered card with the mocker's real KV cache and event publisher behind it (no engine)."""

    def __init__(self, nats_url: str, worker_id: str):
        address = f"127.0.0.1:{9000 + list(ROLES).index(worker_id)}"  # distinct: liveness drops a reused one
        self.card = WorkerCard(worker_id, address, ModelCard("m", "/m", block_size=BS), role=ROLES[worker_id],
                               total_kv_blocks=64, max_num_batched_tokens=2048)
        self.registrar = Registrar(nats_url, self.card)
        self.publisher = KvEventPublisher(nats_url, worker_id, "m")
        self.cache = KvCache(64, BS, self.publisher)

    def cache_prompt(self, toks: list[int]) -> None:
        blocks = full_blocks(toks, BS)
        assert self.cache.allocate(blocks, None)
        self.cache.release([b.block_hash for b in blocks])


@pytest.fixture
async def mesh(nats_url):
    workers = {w: Worker(nats_url, w) for w in ROLES}
    for w in workers.values():
        await w.registrar.start()
        await w.publisher.start()
    registry = WorkerRegistry(nats_url, "router-test")
    cfg = parse_config(["--nats-url", nats_url, "--router-mode", "kv", "--router-conditional-disagg",
                        "--router-conditional-disagg-config", '{"eff_isl_threshold": 4096}'], env={})
    metrics = CollectorRegistry()
    built = build(cfg, registry, metrics)
    await registry.start()
    built.start()
    server = GrpcServer("router", "127.0.0.1", 0)
    servicer = RouterServicer(built.service, built.parts["metrics"].route_duration)
    router_pb2_grpc.add_RouterServiceServicer_to_server(servicer, server.server)
    await server.start()
    await wait_for(lambda: len(registry.workers_for("m")) == 4, 15, "the four cards")
    async with grpc.aio.insecure_channel(server.address) as ch:
        yield router_pb2_grpc.RouterServiceStub(ch), workers, built, metrics
    await server.stop()
    await built.close()
    await registry.close()
    for w in workers.values():
        await w.publisher.close()
        await w.registrar.close()


def route(stub, rid: str, toks: list[int], **pins):
    return stub.Route(router_pb2.RouteRequest(request_id=rid, model="m", block_hashes=block_hashes(toks, BS),
                                              prompt_tokens=len(toks), **pins))


async def test_both_pools_events_steer_the_pair(mesh):
    stub, workers, built, metrics = mesh
    index = built.parts["ingest"].index
    workers["p2"].cache_prompt(tokens(1))
    workers["d2"].cache_prompt(tokens(2))
    await wait_for(lambda: index.find_matches(block_hashes(tokens(1), BS)) == {"p2": 8}
                   and index.find_matches(block_hashes(tokens(2), BS)) == {"d2": 8}, 10, "both pools indexed")
    kept = await route(stub, "b", tokens(2))
    assert (kept.worker_id, kept.prefill_worker_id, kept.disaggregation_reason) == ("d2", "", "cached_prompt")
    split = await route(stub, "a", tokens(1, blocks=8) + tokens(9, blocks=40))
    assert (split.prefill_worker_id, split.prefill_overlap_blocks, split.disaggregation_reason) == \
        ("p2", 8, "disaggregated")
    assert split.worker_id in ("d1", "d2") and split.report_first_token
    await stub.ReleaseBatch(router_pb2.ReleaseBatchRequest(
        first_tokens=[router_pb2.FirstTokenReport(request_id="a")],
        releases=[router_pb2.ReleaseRequest(request_id="b")]))
    bookings = built.service.bookings
    assert bookings.in_flight("p2") == 0 and bookings.in_flight(split.worker_id) == 1
    value = metrics.get_sample_value
    assert value("meshfront_router_disagg_decisions_total", {"reason": "disaggregated"}) == 1
    assert value("meshfront_router_disagg_decisions_total", {"reason": "cached_prompt"}) == 1


@pytest.mark.parametrize(("pins", "param"), [
    ({"prefill_worker_id": "d1"}, "nvext.prefill_worker_id"),
    ({"prefill_worker_id": "gone"}, "nvext.prefill_worker_id"),
    ({"decode_worker_id": "p1"}, "nvext.decode_worker_id"),
    ({"worker_id": "p2"}, "nvext.backend_instance_id"),
])
async def test_a_wrong_role_or_unknown_pin_is_invalid_argument_naming_the_field(mesh, pins, param):
    stub, *_ = mesh
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await route(stub, "r", tokens(3), **pins)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    err = from_rpc_error(e.value)
    assert isinstance(err, InvalidRequest) and err.param == param


async def test_pins_route_where_they_say(mesh):
    stub, *_ = mesh
    r = await route(stub, "r", tokens(4, blocks=40), prefill_worker_id="p1", decode_worker_id="d2")
    assert (r.prefill_worker_id, r.worker_id, r.disaggregation_reason) == ("p1", "d2", "pinned_prefill")
