"""vLLM's KV event batches (msgpack, vLLM's own classes) as engine-neutral events, and the config that turns them on."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import msgspec
from vllm.config import KVEventsConfig
from vllm.distributed.kv_events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

from services.workers.engine_kv import BlocksRemoved, BlocksStored, CacheCleared, EngineKvEvent
from services.workers.vllm.media import extra_key_content_hashes

log = logging.getLogger(__name__)


def events_config(endpoint: str, replay_endpoint: str) -> KVEventsConfig:
    """vLLM's ZMQ publisher on a private endpoint, with a replay buffer for lost batches."""
    return KVEventsConfig(enable_kv_cache_events=True, publisher="zmq", endpoint=endpoint,
                          replay_endpoint=replay_endpoint, topic="meshfront")


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
