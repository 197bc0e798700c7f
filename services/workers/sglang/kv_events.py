"""SGLang's KV event batches (msgpack, SGLang's own classes) as engine-neutral events, and the config
that turns them on.

SGLang's radix cache reports one ``BlockStored`` per page, chained by ``parent_block_hash`` and
merged into runs before publishing; its hashes are its own (the ``default`` format: no Dynamo
namespacing), which the translator maps to Meshfront's.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import msgspec
from sglang.srt.disaggregation.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    KVEventsConfig,
    StorageMedium,
)

from services.workers.engine_kv import BlocksRemoved, BlocksStored, CacheCleared, EngineKvEvent

log = logging.getLogger(__name__)


def events_config(endpoint: str, replay_endpoint: str) -> str:
    """The ``--kv-events-config`` JSON: SGLang's ZMQ publisher on a private endpoint, with a replay buffer."""
    config = KVEventsConfig(publisher="zmq", endpoint=endpoint, replay_endpoint=replay_endpoint, topic="meshfront")
    return config.model_dump_json()


def batch_decoder():
    """A function from one published payload to the events the translator applies."""
    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)

    def decode(payload: bytes) -> Sequence[EngineKvEvent]:
        try:
            batch = decoder.decode(payload)
        except msgspec.ValidationError as e:
            # SGLang's EAGLE "bigram" pages carry token pairs where its own class says ints. A
            # batch we cannot read is a gap: the routers forget this worker's blocks rather
            # than keep ones that may be gone, and indexing restarts from the next batch.
            log.warning("unreadable SGLang KV event batch (%s): reporting the cache cleared", e)
            return [CacheCleared()]
        out: list[EngineKvEvent] = []
        for event in batch.events:
            if isinstance(event, AllBlocksCleared):
                out.append(CacheCleared())
            elif event.medium not in (None, StorageMedium.GPU):
                continue  # a copy in host memory or storage (HiCache): not what a prefill reuses
            elif isinstance(event, BlockStored):
                out.append(BlocksStored(event.block_hashes, event.parent_block_hash, event.token_ids,
                                        event.block_size))
            elif isinstance(event, BlockRemoved):
                out.append(BlocksRemoved(event.block_hashes))
            else:
                raise TypeError(f"unknown SGLang KV event {type(event).__name__}")
        return out

    return decode
