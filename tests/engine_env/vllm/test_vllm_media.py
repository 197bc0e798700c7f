"""The vLLM adapter's image mapping against vLLM 0.32's own classes (runs in .venv-vllm; no engine started).

A multimodal block's extra keys are produced by vLLM's own block-hash code from a Request whose
features carry the uuids the adapter gives, published through vLLM's own event class: the worker's
hashes for them must equal what the preprocessor computes for the same prompt and image.
"""

from __future__ import annotations

import io

import msgspec
import pytest
from PIL import Image
from vllm.distributed.kv_events import BlockStored, KVEventBatch
from vllm.inputs import TokensPrompt
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from vllm.multimodal.parse import parse_mm_uuids
from vllm.sampling_params import SamplingParams
from vllm.v1.core.kv_cache_utils import generate_block_hash_extra_keys, to_event_extra_keys
from vllm.v1.request import Request

from services.common.hashing import block_hashes, media_block_infos, sequence_hashes
from services.workers.engine import MediaInput, RequestRejected
from services.workers.engine_kv import BlockHashTranslator
from services.workers.vllm import media
from services.workers.vllm.kv_events import batch_decoder

BS = 4
PAD = 151655


def png(color: tuple[int, int, int], size: int = 56) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (size, size), color).save(out, format="PNG")
    return out.getvalue()


def image(color, content_hash: int, offset: int, count: int) -> MediaInput:
    return MediaInput("image", content=png(color), mime_type="image/png", content_hash=content_hash,
                      token_offset=offset, token_count=count, width=56, height=56)


def published_extra_keys(tokens: list[int], items: list[MediaInput]) -> list:
    """vLLM's own per-block extra keys for a request whose images carry the adapter's uuids."""
    features = [MultiModalFeatureSpec(data=None, modality="image", identifier=media.mm_uuid(i.content_hash),
                                      mm_position=PlaceholderRange(offset=i.token_offset, length=i.token_count))
                for i in items]
    request = Request("r", tokens, SamplingParams(max_tokens=1), None, mm_features=features)
    keys, mm_idx = [], 0
    for start in range(0, len(tokens) - len(tokens) % BS, BS):
        block_keys, mm_idx = generate_block_hash_extra_keys(request, start, start + BS, mm_idx)
        keys.append(block_keys)
    return to_event_extra_keys(keys)


class Recorder:
    def __init__(self):
        self.stored_hashes: list[int] = []

    def stored(self, blocks, parent_hash):
        self.stored_hashes += [b.block_hash for b in blocks]

    def removed(self, hashes):
        pass

    def cleared(self):
        pass


def worker_hashes(tokens, extra_keys) -> list[int]:
    n = len(tokens) // BS
    event = BlockStored(block_hashes=[f"e{i}".encode() for i in range(n)], parent_block_hash=None,
                        token_ids=tokens[:n * BS], block_size=BS, lora_id=None, medium="GPU", lora_name=None,
                        extra_keys=extra_keys)
    payload = msgspec.msgpack.Encoder().encode(KVEventBatch(ts=1.0, events=[event]))
    recorder = Recorder()
    translator = BlockHashTranslator(recorder, BS)
    for e in batch_decoder()(payload):
        translator.apply(e)
    return recorder.stored_hashes


def test_a_multimodal_blocks_hash_is_salted_as_the_preprocessor_salts_the_prompt():
    # Two images: one inside blocks 1-2, one spanning blocks 3-4 with text around them.
    items = [image((255, 0, 0), 0xDEADBEEF, 5, 6), image((0, 0, 255), 0x1234, 13, 4)]
    tokens = [1, 2, 3, 4, 5] + [PAD] * 6 + [6, 7] + [PAD] * 4 + [8, 9, 10, 11, 12, 13, 14]
    extra_keys = published_extra_keys(tokens, items)
    spans = [(i.token_offset, i.token_count, i.content_hash) for i in items]
    preprocessor = sequence_hashes(block_hashes(tokens, BS, block_mm_infos=media_block_infos(spans, BS)))
    assert worker_hashes(tokens, extra_keys) == preprocessor
    # ... and the salt matters: the same tokens without images hash differently from block 1 on.
    assert worker_hashes(tokens, None)[0] == preprocessor[0]
    assert worker_hashes(tokens, None)[1:] != preprocessor[1:]


def test_a_different_image_in_the_same_place_gets_different_hashes():
    tokens = [1, 2, 3, 4] + [PAD] * 4 + [5, 6, 7, 8]
    first = worker_hashes(tokens, published_extra_keys(tokens, [image((255, 0, 0), 1, 4, 4)]))
    second = worker_hashes(tokens, published_extra_keys(tokens, [image((0, 255, 0), 2, 4, 4)]))
    assert first[0] == second[0] and first[1] != second[1] and first[2] != second[2]


def test_a_block_naming_an_item_vllm_hashed_itself_is_not_indexed():
    tokens = [1, 2, 3, 4] + [PAD] * 4
    keys = [None, (("3f9a0c", 0),)]  # what vLLM publishes when it computed the identifier itself
    assert worker_hashes(tokens, keys) == []


def test_images_become_vllms_multimodal_data_and_uuids():
    items = [image((255, 0, 0), 0xAB, 0, 4), image((0, 0, 255), 0xCD, 6, 4)]
    prompt = TokensPrompt(prompt_token_ids=[PAD] * 4 + [1, 2] + [PAD] * 4)
    prompt.update(media.multimodal_fields(items))  # type: ignore[typeddict-item]
    images = prompt["multi_modal_data"]["image"]
    assert [i.size for i in images] == [(56, 56), (56, 56)] and images[0].getpixel((0, 0)) == (255, 0, 0)
    uuids = parse_mm_uuids(prompt["multi_modal_uuids"])  # vLLM's own reading of the field
    assert list(uuids["image"]) == ["xxh3:00000000000000ab", "xxh3:00000000000000cd"]
    assert [media.content_hash_of(u) for u in uuids["image"]] == [0xAB, 0xCD]


def test_bytes_that_are_not_an_image_are_the_clients_fault():
    with pytest.raises(RequestRejected, match="could not be decoded"):
        media.multimodal_fields([MediaInput("image", content=b"not an image", content_hash=1)])


PROBE = """
import json
from PIL import Image
import vllm.model_executor.models.qwen2_vl  # what vLLM's model registry imports to inspect Qwen2-VL
from transformers.models.qwen2_vl import Qwen2VLProcessor
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
processor = Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=224 * 224)
grid = processor(images=[Image.new("RGB", (112, 112))], return_tensors="np")["image_grid_thw"][0]
import numpy as np
import sitecustomize  # the shim: its PIL video processor stands in for the torchvision one
videos = sitecustomize.PilQwen2VLVideoProcessor(min_pixels=56 * 56, max_pixels=224 * 224)
video = videos(videos=[np.zeros((4, 112, 112, 3), np.uint8)], return_tensors="np")["video_grid_thw"][0].tolist()
print("PROBE " + json.dumps({"grid": grid.tolist(), "attributes": Qwen2VLProcessor.get_attributes(),
                             "video": video}))
"""


def run_probe(with_shim: bool):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # Not inherited: a test that built a vLLM engine in this process has put the shim on os.environ's path
    # (media.enable_pil_processors), and the probe without it must run without it.
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(media.WITHOUT_TORCHVISION)]
    if with_shim:
        paths.insert(0, str(media.WITHOUT_TORCHVISION))
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=600)


def test_vllms_qwen2_vl_loads_with_the_pil_processor_where_torchvision_is_missing():
    import importlib.util
    import json

    assert importlib.util.find_spec("torchvision") is None  # the engine environment this is for
    without = run_probe(with_shim=False)
    assert without.returncode != 0 and "No module named 'torchvision'" in without.stderr
    done = run_probe(with_shim=True)
    assert done.returncode == 0, done.stderr[-3000:]
    probe = json.loads(next(ln for ln in done.stdout.splitlines() if ln.startswith("PROBE "))[6:])
    assert probe["grid"] == [1, 8, 8]  # 112x112: 8x8 patches of 14 px, i.e. 16 tokens after the 2x2 merge
    assert probe["attributes"] == ["image_processor", "tokenizer"]
    assert probe["video"] == [2, 8, 8]  # 4 frames of 112x112: 2 temporal patches (test_vllm_video.py)
