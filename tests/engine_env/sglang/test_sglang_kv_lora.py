"""KV blocks SGLang 0.5.23 stores under a LoRA adapter reach the router salted with the adapter's name, as the
preprocessor salts that adapter's requests (runs in .venv-sglang; no model runs).

SGLang keys an adapter's requests in its own cache namespace (the radix key's ``extra_key`` ends with the
adapter's ``lora_id``) and its event recorder names the adapter (``BlockStored.lora_name``) from the names it
was given (``KvEventLoraNames``). Here SGLang's simulated ``RadixCache`` stores prompts under an adapter's
namespace and records its events; the worker's decoder and translator must hand the router the hashes
``services.common.hashing`` computes with ``lora_name``, and never the base model's.
"""

from __future__ import annotations

import time
import types

import msgspec
from sglang.srt.disaggregation.kv_events import KVEventBatch
from sglang.srt.mem_cache.base_prefix_cache import InsertParams
from sglang.srt.mem_cache.events import KvEventLoraNames
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

from services.common.hashing import block_hashes, media_block_infos, sequence_hashes
from services.models.qwen import ADDED_TOKEN_IDS
from services.workers.engine import EngineRequest, MediaInput
from services.workers.engine_kv import BlockHashTranslator, BlocksStored
from services.workers.sglang.kv_events import batch_decoder, media_pads

PAGE = 16
ADAPTER = "demo-qwen-lora"
LORA_ID = "0123456789abcdef0123456789abcdef"  # SGLang's LoRARef.lora_id: 32 hex characters
PAD = ADDED_TOKEN_IDS["<|image_pad|>"]


class Router:
    def __init__(self) -> None:
        self.hashes: list[int] = []

    def stored(self, blocks, parent_hash) -> None:
        self.hashes += [b.block_hash for b in blocks]

    def removed(self, hashes) -> None:
        raise AssertionError("nothing is evicted here")

    def cleared(self) -> None:
        raise AssertionError("nothing is cleared here")


def serve(ids, extra_key: str | None, pads=None):
    """SGLang's cache stores ``ids`` in ``extra_key``'s namespace (the adapter's, named); the worker translates."""
    names = KvEventLoraNames()
    names.register(types.SimpleNamespace(lora_id=LORA_ID, extra_key=LORA_ID), ADAPTER)  # as SGLang registers a Req
    cache = RadixCache.create_simulated(page_size=PAGE, enable_kv_cache_events=True, kv_event_lora_names=names)
    cache.take_events()
    cache.insert(InsertParams(key=RadixKey(list(ids), extra_key=extra_key)))
    payload = msgspec.msgpack.Encoder().encode(KVEventBatch(ts=time.time(), events=cache.take_events()))
    router = Router()
    translator = BlockHashTranslator(router, PAGE)
    events = batch_decoder(pads if pads is not None else media_pads())(payload)
    for event in events:
        translator.apply(event)
    return events, router.hashes


def test_an_adapters_blocks_are_salted_with_its_name():
    ids = list(range(1000, 1000 + 3 * PAGE))
    events, hashes = serve(ids, extra_key=LORA_ID)
    assert [e.lora_name for e in events if isinstance(e, BlocksStored)] == [ADAPTER]
    assert hashes == sequence_hashes(block_hashes(ids, PAGE, lora_name=ADAPTER))
    assert set(hashes).isdisjoint(sequence_hashes(block_hashes(ids, PAGE)))  # never the base model's
    _, base = serve(ids, extra_key=None)
    assert base == sequence_hashes(block_hashes(ids, PAGE))


def test_an_adapters_image_blocks_carry_both_salts():
    ids = [1, 2, 3, *([PAD] * 20), *range(500, 540)]
    item = MediaInput("image", content=b"x", content_hash=0xC0FFEE, token_offset=3, token_count=20)
    pads = media_pads()
    pads.register(EngineRequest("r", ids, media=(item,)))
    padded = ids[:3] + list(_padding(0xC0FFEE, 20)) + ids[23:]
    _, hashes = serve(padded, extra_key=LORA_ID, pads=pads)
    infos = media_block_infos([(3, 20, 0xC0FFEE)], PAGE)
    assert hashes == sequence_hashes(block_hashes(ids, PAGE, block_mm_infos=infos, lora_name=ADAPTER))


def _padding(content_hash: int, length: int) -> list[int]:
    from sglang.srt.managers.schedule_batch import Modality, MultimodalDataItem

    item = MultimodalDataItem(modality=Modality.IMAGE)
    item.set_hash(content_hash)
    return item.padding_sequence(length)
