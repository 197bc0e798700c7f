"""SGLang's KV event batches (msgpack, SGLang's own classes) as engine-neutral events, and the config
that turns them on.

SGLang's radix cache reports one ``BlockStored`` per page, chained by ``parent_block_hash`` and
merged into runs before publishing; its hashes are its own (the ``default`` format: no Dynamo
namespacing), which the translator maps to Meshfront's. A page of an image reports the image's pad values
(derived from the content hash the worker sent as ``mm_hashes``) where the prompt had placeholder ids:
``MediaPads`` (kv_media.py) turns them back into the placeholder ids and the block's media salt, so the
translator computes the hashes the preprocessor computed for the prompt. A block stored under a LoRA adapter
names it (``BlockStored.lora_name``, the adapter's public name, which SGLang's recorder resolves from the
cache's namespace): the translator salts its hashes with it, as the preprocessor salts an adapter's requests.

With data-parallel ranks (``--dp-size``, ``--attn-dp-size``) each scheduler publishes on its own endpoint, which
SGLang derives from the configured one by adding its rank to the port (an ipc:// endpoint is refused above rank 0,
and a port of 0 would become port 1, 2 ... for the next ranks). A worker with ranks configures a fixed loopback
port run, bound by each scheduler (``ranked_events_config``), and subscribes where SGLang's own rule puts each
rank (``rank_sources``).
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
    ZmqEventPublisher,
)

from services.workers.engine_kv import BlocksRemoved, BlocksStored, CacheCleared, EngineKvEvent
from services.workers.engine_ranks import RankSource, free_port_run
from services.workers.sglang.kv_media import DEFAULT_CAPACITY, MediaPads

log = logging.getLogger(__name__)


def events_config(endpoint: str, replay_endpoint: str) -> str:
    """The ``--kv-events-config`` JSON: SGLang's ZMQ publisher on a private endpoint, with a replay buffer."""
    config = KVEventsConfig(publisher="zmq", endpoint=endpoint, replay_endpoint=replay_endpoint, topic="meshfront")
    return config.model_dump_json()


def ranked_events_config(ranks: int, host: str = "127.0.0.1") -> str:
    """The ``--kv-events-config`` JSON of ``ranks`` schedulers: events on ports P..P+ranks-1 and replays on the
    next ``ranks`` ports, of one free loopback run, bound there (not on every interface) by each scheduler."""
    base = free_port_run(2 * ranks, host)
    config = KVEventsConfig(publisher="zmq", endpoint=f"tcp://{host}:{base}", bind=True,
                            replay_endpoint=f"tcp://{host}:{base + ranks}", topic="meshfront")
    return config.model_dump_json()


def rank_sources(kv_events_config: str, ranks: int) -> list[RankSource]:
    """Where each rank's scheduler publishes under ``kv_events_config``, by SGLang's own rule."""
    config = KVEventsConfig.model_validate_json(kv_events_config)
    offset = ZmqEventPublisher.offset_endpoint_port
    return [RankSource(rank, offset(config.endpoint, rank), offset(config.replay_endpoint, rank))
            for rank in range(ranks)]


def pad_values(content_hash: int) -> tuple[int, ...]:
    """The pad values SGLang gives an item whose ``mm_hashes`` entry is ``content_hash`` (what its tokenizer
    manager does with the entry: ``MultimodalDataItem.set_hash``)."""
    from sglang.srt.managers.schedule_batch import Modality, MultimodalDataItem  # see media_pads

    item = MultimodalDataItem(modality=Modality.IMAGE)
    item.set_hash(content_hash)
    return item.padding_values()


def media_pads(capacity: int = DEFAULT_CAPACITY) -> MediaPads:
    """The worker's table of the pad values it gave SGLang (filled by the engine, read by ``batch_decoder``)."""
    # Imported here, not with the module: schedule_batch imports SGLang's model-config registry, which imports
    # torchvision, and a CPU engine environment has none (the worker's import check must pass without it).
    from sglang.srt.managers.schedule_batch import MM_PAD_SHIFT_VALUE

    return MediaPads(pad_values, MM_PAD_SHIFT_VALUE, capacity)


def batch_decoder(pads: MediaPads):
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
                stored = _stored(event, pads)
                if stored is not None:
                    out.append(stored)
            elif isinstance(event, BlockRemoved):
                out.append(BlocksRemoved(event.block_hashes))
            else:
                raise TypeError(f"unknown SGLang KV event {type(event).__name__}")
        return out

    return decode


def _stored(event: BlockStored, pads: MediaPads) -> BlocksStored | None:
    """The event as the translator's, its image pages mapped back to placeholder ids and media salts, under
    the adapter it names."""
    if not pads.holds_media(event.token_ids):
        return BlocksStored(event.block_hashes, event.parent_block_hash, event.token_ids, event.block_size,
                            lora_name=event.lora_name)
    restored = pads.restore(event.token_ids, event.block_size)
    if restored.unknown_pad is not None:
        skipped = len(event.block_hashes) - restored.blocks
        log.warning("not indexing %d stored block(s): they hold an image the worker did not name (pad value %d: "
                    "SGLang hashed it itself)", skipped, restored.unknown_pad)
        if restored.blocks == 0:
            return None
    return BlocksStored(event.block_hashes[:restored.blocks], event.parent_block_hash, restored.token_ids,
                        event.block_size, block_mm_infos=restored.block_mm_infos, lora_name=event.lora_name)
