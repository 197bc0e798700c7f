"""vLLM's KV event batches (msgpack, vLLM's own classes) as engine-neutral events, and the config that turns them on.

With ``--data-parallel-size`` above 1 each engine core publishes on its own endpoint, which vLLM derives from the
configured one by the core's rank: it refuses an ipc:// endpoint above rank 0, and leaves a tcp port of 0 to the
OS per core, each core reporting where it bound (``AsyncLLM.get_kv_event_sources``). A worker with ranks asks
for ``RANKED_ENDPOINT`` and subscribes where each core says (``rank_sources``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import msgspec
from vllm.config import KVEventsConfig
from vllm.distributed.kv_events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

from services.workers.engine_kv import BlocksRemoved, BlocksStored, CacheCleared, EngineKvEvent
from services.workers.engine_ranks import RankSource
from services.workers.vllm.media import extra_key_content_hashes

log = logging.getLogger(__name__)

# vLLM binds "tcp://*:0" on the node's address (VLLM_HOST_IP: the worker sets 127.0.0.1 for a loopback --host)
# on a port the OS picks, per engine core; any other tcp endpoint is either connected to, not bound, or one
# fixed port per rank that the worker would have to find free.
RANKED_ENDPOINT = "tcp://*:0"


def events_config(endpoint: str, replay_endpoint: str) -> KVEventsConfig:
    """vLLM's ZMQ publisher on a private endpoint, with a replay buffer for lost batches."""
    return KVEventsConfig(enable_kv_cache_events=True, publisher="zmq", endpoint=endpoint,
                          replay_endpoint=replay_endpoint, topic="meshfront")


def ranked_events_config() -> KVEventsConfig:
    """The publishers of an engine with data-parallel ranks: one per engine core, each where the OS puts it."""
    return events_config(RANKED_ENDPOINT, RANKED_ENDPOINT)


def rank_sources(sources: Mapping[int, KVEventsConfig]) -> list[RankSource]:
    """Where each engine core publishes, as a started engine reports it (``AsyncLLM.get_kv_event_sources``)."""
    return [RankSource(rank, config.endpoint, config.replay_endpoint) for rank, config in sorted(sources.items())]


def batch_decoder():
    """A function from one published payload to the events the translator applies."""
    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)

    def decode(payload: bytes) -> Sequence[EngineKvEvent]:
        out: list[EngineKvEvent] = []
        for event in decoder.decode(payload).events:
            if isinstance(event, AllBlocksCleared):
                out.append(CacheCleared())
            elif event.medium not in (None, MEDIUM_GPU) or event.group_idx not in (None, 0):
                continue  # an offloading tier's copy, or a hybrid model's other cache group
            elif isinstance(event, BlockStored):
                try:  # the images a block holds salt its hash, as the preprocessor salted the prompt's
                    mm_infos = extra_key_content_hashes(event.extra_keys, len(event.block_hashes))
                except ValueError as e:
                    log.warning("not indexing %d stored block(s): %s", len(event.block_hashes), e)
                    continue  # the blocks after them go unindexed too: their parent is unknown
                out.append(BlocksStored(event.block_hashes, event.parent_block_hash, event.token_ids,
                                        event.block_size, block_mm_infos=mm_infos, lora_name=event.lora_name))
            elif isinstance(event, BlockRemoved):
                out.append(BlocksRemoved(event.block_hashes))
            else:
                raise TypeError(f"unknown vLLM KV event {type(event).__name__}")
        return out

    return decode
