"""SGLang's data-parallel ranks (``--dp-size``, ``--attn-dp-size``) as the worker registers them, against SGLang's
own parser and KV event publisher (no engine started): the worker configures a loopback tcp port run, each rank's
publisher (SGLang's class, given its rank) binds its own ports, and the worker's per-rank subscribers translate
each rank's events into that rank's stream alone."""

from __future__ import annotations

import asyncio
import atexit
import inspect
import json
import time
from array import array
from pathlib import Path

import pytest
from sglang.srt.disaggregation.kv_events import EventPublisherFactory, KVEventBatch, KVEventsConfig
from sglang.srt.entrypoints.engine import Engine
from sglang.srt.mem_cache.events import KVCacheEventRecorder
from sglang.srt.mem_cache.radix_cache import RadixKey, TreeNode

from services.common.hashing import block_hashes, sequence_hashes
from services.workers.engine_ranks import ranked_kv_events
from services.workers.sglang.config import dp_ranks, parse_config
from services.workers.sglang.kv_events import batch_decoder, media_pads, rank_sources

PAGE = 4


@pytest.fixture
def model_dir(tmp_path) -> Path:
    path = tmp_path / "demo-model"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    return path


@pytest.mark.parametrize("flags", [["--dp-size", "2"], ["--attn-dp-size", "2"]])
def test_a_registered_worker_with_ranks_gives_sglang_a_loopback_port_run(model_dir, flags):
    server_args = parse_config(["--model-dir", str(model_dir), *flags], env={}).server_args()
    assert dp_ranks(server_args) == 2
    config = KVEventsConfig.model_validate_json(server_args.kv_events_config)
    assert config.bind is True and config.publisher == "zmq"
    sources = rank_sources(server_args.kv_events_config, 2)
    ports = [int(e.rsplit(":", 1)[1]) for s in sources for e in (s.endpoint, s.replay_endpoint)]
    assert all(e.startswith("tcp://127.0.0.1:") for s in sources for e in (s.endpoint, s.replay_endpoint))
    assert len(set(ports)) == 4 and max(ports) - min(ports) == 3  # one run: no rank's socket is another's


def test_without_ranks_the_private_ipc_endpoint_stays(model_dir):
    server_args = parse_config(["--model-dir", str(model_dir)], env={}).server_args()
    assert dp_ranks(server_args) == 1
    assert KVEventsConfig.model_validate_json(server_args.kv_events_config).endpoint.startswith("ipc://")


def test_sglangs_engine_takes_the_routed_rank():
    assert "routed_dp_rank" in inspect.signature(Engine.async_generate).parameters


def _radix_node(tokens) -> TreeNode:
    root = TreeNode()
    root.key = RadixKey(array("q"))
    root.hash_value = []
    node = TreeNode()
    node.parent = root
    node.key = RadixKey(array("q", tokens))
    return node


def _store_batch(tokens) -> KVEventBatch:
    recorder = KVCacheEventRecorder(enabled=True, page_size=PAGE)
    recorder.record_store(_radix_node(tokens))
    return KVEventBatch(ts=time.time(), events=recorder.take())


async def _until_heard(publisher, heard: list, timeout: float = 30.0) -> None:
    """Waits, the scheduler going on meanwhile (an empty batch every 0.1 s), until its rank's listener has heard.
    The worker's subscription connects in ZMQ's background thread, and a PUB socket drops what no subscriber
    has asked for yet (the slow joiner): on a loaded machine a rank's first batch can go out before its
    subscription takes effect. The subscriber then asks for it when the next batch's sequence number shows the
    gap, as it does behind a serving engine; a test that published once and waited would wait forever. The
    deadline is for a machine running a whole suite on two cores."""
    deadline = time.monotonic() + timeout
    while not heard:
        assert time.monotonic() < deadline, "timed out"
        publisher.publish(KVEventBatch(ts=time.time(), events=[]))
        await asyncio.sleep(0.1)


async def test_each_ranks_events_reach_that_ranks_listener_alone(model_dir):
    server_args = parse_config(["--model-dir", str(model_dir), "--dp-size", "2"], env={}).server_args()
    publishers = [EventPublisherFactory.create(server_args.kv_events_config, rank) for rank in (0, 1)]
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

    closers = ranked_kv_events(rank_sources(server_args.kv_events_config, 2), PAGE, lambda: batch_decoder(media_pads()),
                               RankListener)
    try:
        one, zero = list(range(100, 108)), list(range(300, 304))
        publishers[1].publish(_store_batch(one))  # rank 1's first batch: replayed if its subscription is late
        await _until_heard(publishers[1], heard[1])
        publishers[0].publish(_store_batch(zero))
        await _until_heard(publishers[0], heard[0])
        assert heard == {1: [sequence_hashes(block_hashes(one, PAGE))], 0: [sequence_hashes(block_hashes(zero, PAGE))]}
    finally:
        for close in closers:
            await close()
        for publisher in publishers:
            publisher.shutdown()
            atexit.unregister(publisher.shutdown)  # SGLang registers it for interpreter exit as well
