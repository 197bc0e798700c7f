"""VllmEngine's data-parallel ranks around vLLM 0.32's own classes, no engine started (tests/engine/test_vllm_dp.py
runs a real ``--data-parallel-size 2`` engine behind the mesh): which ranks the worker drives, the engine core a
request's rank runs on, each rank's load from vLLM's per-engine stat loggers, and each rank's KV events from
vLLM's own publisher, given its rank, to that rank's listener alone.

    .venv-vllm/bin/python -m pytest tests/engine_env/vllm -o addopts="--import-mode=importlib"
"""

from __future__ import annotations

import asyncio
import inspect
import time
import types

import pytest
from vllm.config import ParallelConfig
from vllm.distributed.kv_events import BlockStored, EventPublisherFactory, KVEventBatch
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.metrics.loggers import PerEngineStatLoggerAdapter
from vllm.v1.metrics.stats import SchedulerStats

from services.common.hashing import block_hashes, sequence_hashes
from services.workers.engine import EngineRequest, RequestRejected
from services.workers.engine_ranks import ranked_kv_events
from services.workers.vllm.config import parse_config
from services.workers.vllm.engine import VllmEngine
from services.workers.vllm.kv_events import RANKED_ENDPOINT, batch_decoder, rank_sources

INTERNAL = {"data_parallel_size": 2}  # one node drives both ranks (vLLM's internal load balancing)
HYBRID = {"data_parallel_size": 4, "data_parallel_size_local": 2, "data_parallel_rank": 2,
          "data_parallel_hybrid_lb": True}  # the second of two nodes: ranks 2 and 3


class FakeAsyncLLM:
    """``AsyncLLM.generate`` as it streams one finished DELTA output, after ``gate`` opens; records the rank."""

    def __init__(self, parallel: dict, num_gpu_blocks: int = 1024):
        self.vllm_config = types.SimpleNamespace(parallel_config=ParallelConfig(**parallel),
                                                 cache_config=types.SimpleNamespace(num_gpu_blocks=num_gpu_blocks))
        self.model_config = types.SimpleNamespace(max_model_len=100)
        self.ranks: list[int | None] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def generate(self, prompt, params, request_id, lora_request=None, data_parallel_rank=None):
        self.ranks.append(data_parallel_rank)
        await self.gate.wait()
        yield RequestOutput(request_id, None, prompt["prompt_token_ids"], None,
                            [CompletionOutput(0, "", [7], None, None, finish_reason="length")], True,
                            num_cached_tokens=0)


def engine_with(llm: FakeAsyncLLM) -> VllmEngine:
    engine = VllmEngine(engine_args=None)
    engine._llm = llm  # what start() sets
    return engine


async def run(engine: VllmEngine, dp_rank: int | None) -> None:
    async for _ in engine.generate(EngineRequest("r", [1, 2, 3], max_tokens=1, dp_rank=dp_rank)):
        pass


def test_vllms_generate_takes_the_engine_cores_index():
    assert "data_parallel_rank" in inspect.signature(AsyncLLM.generate).parameters
    assert "get_kv_event_sources" in dir(AsyncLLM)


@pytest.mark.parametrize(("parallel", "ranks", "has_ranks"), [
    ({}, range(0, 1), False), (INTERNAL, range(0, 2), True), (HYBRID, range(2, 4), True)])
def test_the_worker_declares_the_ranks_of_the_engine_cores_it_drives(parallel, ranks, has_ranks):
    engine = engine_with(FakeAsyncLLM(parallel))
    assert (engine.dp_ranks, engine.has_ranks) == (ranks, has_ranks)
    assert engine.num_kv_blocks == 1024 // len(ranks)  # vLLM sums its cores' blocks; the card wants one rank's


async def test_a_request_runs_on_the_engine_core_of_its_rank():
    llm = FakeAsyncLLM(HYBRID)
    engine = engine_with(llm)
    for rank in (3, 2, None):
        await run(engine, rank)
    assert llm.ranks == [1, 0, None]  # the index among this node's cores; None: vLLM's own balancing


async def test_a_rank_the_worker_lacks_is_refused_naming_dp_rank_before_vllm_sees_it():
    llm = FakeAsyncLLM(HYBRID)
    engine = engine_with(llm)
    with pytest.raises(RequestRejected, match="no data-parallel rank 1 .its ranks: 2, 3") as e:
        await run(engine, 1)
    assert e.value.param == "dp_rank" and llm.ranks == [] and engine.in_flight.total == 0


async def test_a_worker_without_ranks_sends_vllm_no_rank():
    llm = FakeAsyncLLM({})
    await run(engine_with(llm), 0)
    assert llm.ranks == [None]


async def test_each_ranks_load_comes_from_its_own_engine_cores_stats():
    llm = FakeAsyncLLM(INTERNAL)
    engine = engine_with(llm)
    # vLLM's adapter makes one of the worker's stat loggers per engine core and hands each core's stats to its own.
    loggers = PerEngineStatLoggerAdapter(None, [0, 1], engine.load.stat_logger_factory())
    loggers.record(SchedulerStats(num_running_reqs=3, num_waiting_reqs=2, kv_cache_usage=0.5), None, engine_idx=1)
    loggers.record(SchedulerStats(num_running_reqs=9, num_waiting_reqs=9, kv_cache_usage=0.9), None, engine_idx=0)
    idle = {"active_blocks": 0, "waiting": 0, "running": 0, "total_blocks": 512}
    llm.gate.clear()
    task = asyncio.ensure_future(run(engine, 1))
    while not llm.ranks:
        await asyncio.sleep(0)
    assert engine.read_load(1) == {"active_blocks": 256, "waiting": 2, "running": 3, "total_blocks": 512}
    assert engine.read_load(0) == idle  # nothing of this worker's runs there: its last stats are stale
    llm.gate.set()
    await task
    assert engine.read_load(1) == idle


def test_a_registered_worker_with_ranks_lets_each_engine_core_bind_its_own_port(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    args = parse_config(["--model-dir", str(model), "--data-parallel-size", "2"], env={}).engine_args()
    events = args.kv_events_config
    assert (args.data_parallel_size, events.endpoint, events.replay_endpoint) == (2, RANKED_ENDPOINT, RANKED_ENDPOINT)
    one = parse_config(["--model-dir", str(model)], env={}).engine_args().kv_events_config
    assert one.endpoint.startswith("ipc://")  # without ranks: the private endpoint


async def until_each_rank_heard(publishers: dict, heard: dict[int, list], timeout: float = 30.0) -> None:
    """Waits, the cores going on meanwhile (an empty batch from each every 0.1 s), until every rank's listener
    has heard. The worker's subscriptions connect in ZMQ's background thread, and a PUB socket drops what no
    subscriber has asked for yet (the slow joiner): on a loaded machine a rank's first batch can go out before
    its subscription takes effect. The subscriber then asks for it when the next batch's sequence number shows
    the gap, as it does behind a serving engine; a test that published once and waited would wait forever.
    The deadline is for a machine running a whole suite on two cores."""
    deadline = time.monotonic() + timeout
    while not all(heard.values()):
        assert time.monotonic() < deadline, heard
        for publisher in publishers.values():
            publisher.publish(KVEventBatch(ts=time.time(), events=[]))
        await asyncio.sleep(0.1)


async def test_each_engine_cores_events_reach_that_ranks_listener_alone(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_HOST_IP", "127.0.0.1")  # what the worker sets for a loopback --host
    model = tmp_path / "m"
    model.mkdir()
    cfg = parse_config(["--model-dir", str(model), "--data-parallel-size", "2"], env={})
    config = cfg.engine_args().kv_events_config
    publishers = {rank: EventPublisherFactory.create(config, rank) for rank in (0, 1)}  # what each core makes
    sources = rank_sources({rank: p.get_publisher_config() for rank, p in publishers.items()})
    assert len({s.endpoint for s in sources} | {s.replay_endpoint for s in sources}) == 4
    heard: dict[int, list] = {0: [], 1: []}

    class RankListener:
        def __init__(self, rank: int) -> None:
            self.rank = rank

        def stored(self, blocks, parent_hash) -> None:
            heard[self.rank].append([b.block_hash for b in blocks])

        def removed(self, hashes) -> None:
            raise AssertionError(f"nothing was evicted: {hashes}")

        def cleared(self) -> None:
            raise AssertionError("nothing was cleared")

    closers = ranked_kv_events(sources, 4, batch_decoder, RankListener)
    one, zero = list(range(100, 108)), list(range(300, 304))
    try:
        publishers[1].publish(KVEventBatch(ts=time.time(), events=[BlockStored(
            block_hashes=[b"a", b"b"], parent_block_hash=None, token_ids=one, block_size=4, lora_id=None,
            medium="GPU", lora_name=None)]))  # rank 1's first batch: replayed if its subscription is late
        publishers[0].publish(KVEventBatch(ts=time.time(), events=[BlockStored(
            block_hashes=[b"a"], parent_block_hash=None, token_ids=zero, block_size=4, lora_id=None,
            medium="GPU", lora_name=None)]))  # the same engine hash on another core: another cache
        await until_each_rank_heard(publishers, heard)
        assert heard == {1: [sequence_hashes(block_hashes(one, 4))], 0: [sequence_hashes(block_hashes(zero, 4))]}
    finally:
        for close in closers:
            await close()
        for publisher in publishers.values():
            publisher.shutdown()
