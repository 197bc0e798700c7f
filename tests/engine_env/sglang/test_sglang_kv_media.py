"""KV block hashes of an image prompt on SGLang 0.5.23 equal the preprocessor's (runs in .venv-sglang; no model runs).

The worker sends each image's content hash as ``mm_hashes``; SGLang derives the image's pad values from it
(its tokenizer manager's ``MultimodalDataItem.set_hash``), writes them over the placeholder run
(``pad_mm_tokens``, Qwen2-VL's ``pad_input_ids``) and keys its radix cache, and so its KV events, by the
padded ids. Here SGLang's own simulated ``RadixCache`` stores those padded prompts and records its events;
they go through the worker's decoder and translator, and the hashes the router receives must be the ones the
preprocessor computes for the same request (placement, ``media_block_infos``, ``block_hashes``).
"""

from __future__ import annotations

import io
import time
from array import array

import msgspec
from PIL import Image
from sglang.srt.disaggregation.kv_events import KVEventBatch
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.mm_utils import pad_mm_tokens
from sglang.srt.managers.schedule_batch import Modality, MultimodalDataItem, MultimodalInputs
from sglang.srt.mem_cache.base_prefix_cache import InsertParams
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

from services.common.hashing import block_hashes, media_block_infos, sequence_hashes
from services.models.qwen import ADDED_TOKEN_IDS
from services.preprocessor.media.placement import VisionSpec, expand, image_tokens
from services.preprocessor.media.resolve import content_hash
from services.workers.engine import EngineRequest, MediaInput
from services.workers.engine_kv import BlockHashTranslator, BlocksStored
from services.workers.sglang import media, sampling
from services.workers.sglang.engine import SglangEngine
from services.workers.sglang.kv_events import batch_decoder, media_pads
from services.workers.sglang.kv_media import DEFAULT_CAPACITY

PAGE = 16
PAD, START, END = (ADDED_TOKEN_IDS[t] for t in ("<|image_pad|>", "<|vision_start|>", "<|vision_end|>"))
SPEC = VisionSpec(placeholder_ids={"image": PAD})
LIMITS = sampling.EngineLimits(max_model_len=32768)


def png(color, size=(56, 84)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format="PNG")
    return out.getvalue()


RED, BLUE = png((255, 0, 0)), png((0, 0, 255))


class Request:
    """One chat prompt with images, as the preprocessor prepares it and the SGLang worker sends it."""

    def __init__(self, before: list[int], images: list[bytes], after: list[int]):
        rendered: list[int] = list(before)
        for i, _ in enumerate(images):
            rendered += [START, PAD, END] + ([9707 + i] if i < len(images) - 1 else [])
        rendered += after
        counts = [("image", image_tokens(*Image.open(io.BytesIO(raw)).size, SPEC)) for raw in images]
        self.token_ids, placed = expand(rendered, counts, SPEC)  # the preprocessor's placement
        hashes = [content_hash(raw) for raw in images]
        self.media = tuple(MediaInput("image", content=raw, content_hash=h, token_offset=p.offset,
                                      token_count=p.count) for raw, h, p in zip(images, hashes, placed, strict=True))
        # What the preprocessor sends the router (services/preprocessor/service.py).
        infos = media_block_infos([(p.offset, p.count, h) for p, h in zip(placed, hashes, strict=True)], PAGE)
        self.router_hashes = sequence_hashes(block_hashes(self.token_ids, PAGE, block_mm_infos=infos))
        self.unsalted_hashes = sequence_hashes(block_hashes(self.token_ids, PAGE))
        self.engine_request = EngineRequest("r", self.token_ids, media=self.media)

    def sglang_padded_ids(self, kwargs=None) -> array:
        """The ids SGLang's radix cache keys this prompt by: the request's ``mm_hashes`` applied as its tokenizer
        manager applies them, then Qwen2-VL's padding (``pad_mm_tokens``) over each placeholder run.
        ``kwargs``: what the adapter sends (by default, its pure mapping's)."""
        if kwargs is None:
            kwargs = {**sampling.request_kwargs(self.engine_request, "rid-0", LIMITS),
                      **media.media_kwargs(self.engine_request)}
        obj = GenerateReqInput(**kwargs)
        obj.normalize_batch_and_arguments()
        items = []
        for item, hex_hash in zip(self.media, obj.mm_hashes, strict=True):
            mm = MultimodalDataItem(modality=Modality.IMAGE,
                                    offsets=[(item.token_offset, item.token_offset + item.token_count - 1)])
            mm.set_hash(int(hex_hash, 16))  # TokenizerManager: the caller's mm_hashes entry
            items.append(mm)
        # The adapter sends each run collapsed; SGLang's processor expands it back to the mesh's ids
        # (test_sglang_mm_processor.py), which it pads.
        assert len(obj.input_ids) == len(self.token_ids) - sum(item.token_count - 1 for item in self.media)
        return pad_mm_tokens(array("q", self.token_ids), MultimodalInputs(mm_items=items, im_token_id=PAD))


class Router:
    """The KvEventListener: every block hash the router would index, in order."""

    def __init__(self) -> None:
        self.hashes: list[int] = []

    def stored(self, blocks, parent_hash) -> None:
        self.hashes += [b.block_hash for b in blocks]

    def removed(self, hashes) -> None:
        raise AssertionError("nothing is evicted here")

    def cleared(self) -> None:
        raise AssertionError("nothing is cleared here")


class Worker:
    """SGLang's radix cache on one side; on the other, the worker's engine adapter (no engine started) and its
    event path, as main.py wires them."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.cache = RadixCache.create_simulated(page_size=PAGE, enable_kv_cache_events=True)
        self.cache.take_events()  # the cleared cache its reset() reports
        self.engine = SglangEngine(server_args=None, reasoning_parser="")
        self.engine._limits = LIMITS  # what start() reads from a started engine
        self.engine.media_pads = self.pads = media_pads(capacity)
        self.router = Router()
        self.translator = BlockHashTranslator(self.router, PAGE)
        self.decode = batch_decoder(self.engine.media_pads)

    def serve(self, request: Request) -> list:
        """The adapter builds the request (registering its images); SGLang caches the padded prompt and
        publishes its events; the worker translates them. Returns the decoded events."""
        kwargs = self.engine.request_kwargs(request.engine_request, "rid-0")
        self.cache.insert(InsertParams(key=RadixKey(request.sglang_padded_ids(kwargs))))
        payload = msgspec.msgpack.Encoder().encode(KVEventBatch(ts=time.time(), events=self.cache.take_events()))
        events = self.decode(payload)
        for event in events:
            self.translator.apply(event)
        return events


def full_blocks(request: Request) -> int:
    return len(request.token_ids) // PAGE


def test_sglangs_padded_prompt_is_not_the_prompt_the_router_hashed():
    """Why the translation is needed: SGLang's events carry pad values (above any token id) where the
    preprocessor hashed the placeholder id."""
    request = Request([1, 2, 3], [RED], [4, 5])
    padded = request.sglang_padded_ids()
    item = request.media[0]
    run = padded[item.token_offset:item.token_offset + item.token_count]
    assert PAD not in run and min(run) >= 1_000_000
    assert list(padded[:item.token_offset]) == request.token_ids[:item.token_offset]


def test_an_image_prompts_blocks_reach_the_router_under_the_preprocessors_hashes():
    request = Request(list(range(100, 113)), [RED], list(range(200, 240)))
    worker = Worker()
    events = worker.serve(request)
    assert any(isinstance(e, BlocksStored) and e.block_mm_infos for e in events)
    assert worker.router.hashes == request.router_hashes
    assert worker.router.hashes != request.unsalted_hashes  # the image's blocks are salted
    assert worker.translator.skipped_blocks == 0


def test_the_same_image_hits_and_a_different_image_does_not():
    prefix, suffix = list(range(100, 120)), list(range(200, 240))  # the image starts in block 1
    first, same, other = Request(prefix, [RED], suffix), Request(prefix, [RED], suffix + [7] * PAGE), \
        Request(prefix, [BLUE], suffix)
    worker = Worker()
    worker.serve(first)
    worker.serve(same)  # SGLang stores only the new page, under the cached image's node
    assert worker.router.hashes == same.router_hashes  # the router's index: the same chain, one more block
    assert worker.translator.skipped_blocks == 0
    worker.serve(other)
    stored_for_other = worker.router.hashes[len(same.router_hashes):]
    image_block = other.media[0].token_offset // PAGE
    assert image_block == 1
    # The blocks before the image are the cached prefix (not announced again); from the image on, all differ.
    assert stored_for_other == other.router_hashes[image_block:]
    assert set(other.router_hashes[image_block:]).isdisjoint(first.router_hashes)


def test_two_images_and_one_image_twice_in_a_block_count_as_the_preprocessor_counts_them():
    # Qwen2-VL's smallest image is 4 tokens: two of them share a block, the same one twice counts twice.
    tiny = png((0, 255, 0), size=(28, 28))
    request = Request([1, 2], [tiny, tiny, RED], list(range(300, 340)))
    assert request.media[0].token_count == 4
    worker = Worker()
    events = worker.serve(request)
    infos = [e.block_mm_infos for e in events if isinstance(e, BlocksStored)]
    assert infos[0][0] == [content_hash(tiny)] * 2  # block 0 holds both tiny items
    assert worker.router.hashes == request.router_hashes


def test_an_image_the_worker_did_not_name_cuts_the_event_before_its_block():
    """SGLang padded with pad values the worker never gave (its own feature hash): those blocks and every
    block after them stay out of the index instead of being guessed."""
    request = Request(list(range(100, 140)), [RED], list(range(200, 240)))
    worker = Worker()
    worker.cache.insert(InsertParams(key=RadixKey(request.sglang_padded_ids())))  # never registered
    payload = msgspec.msgpack.Encoder().encode(KVEventBatch(ts=time.time(), events=worker.cache.take_events()))
    for event in worker.decode(payload):
        worker.translator.apply(event)
    image_block = request.media[0].token_offset // PAGE
    assert image_block == 2
    assert worker.router.hashes == request.router_hashes[:image_block]  # the text blocks before it only


def test_an_image_forgotten_by_the_table_is_not_guessed_and_a_new_request_brings_it_back():
    request, other = Request([1, 2, 3], [RED], list(range(200, 240))), Request([1, 2, 3], [BLUE], [5] * 40)
    worker = Worker(capacity=1)
    worker.pads.register(request.engine_request)
    worker.pads.register(other.engine_request)  # RED's pad values are dropped
    assert len(worker.pads) == 1
    padded = request.sglang_padded_ids()
    assert worker.pads.restore(padded, PAGE).unknown_pad is not None
    worker.serve(request)
    assert worker.router.hashes == request.router_hashes
