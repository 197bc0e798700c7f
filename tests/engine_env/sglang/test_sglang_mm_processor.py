"""What SGLang 0.5.23 makes of the SGLang worker's image and video requests, on its own multimodal processor
(runs in .venv-sglang, on a CPU; no model runs).

The oracle is SGLang's tokenizer manager for the demo vision model (services/models/qwen_vl.py), built by its own
``init_tokenizer_manager`` (sockets and all: nothing is sent), its ``QwenVLImageProcessor`` and transformers'
Qwen2-VL processor (the PIL versions: conftest.py). Each request is the one the worker's engine adapter builds
(``SglangEngine.request_kwargs``) from a prompt the preprocessor placed (``placement.expand``, the counts
its ``item_tokens`` gives), and goes through ``TokenizerManager._tokenize_one_request``, the step that turns a
``GenerateReqInput`` into what the scheduler runs: its ``input_ids`` must be the mesh's, token for token, and
its ``mm_items`` one per item, each covering exactly the item's run and carrying the item's content hash, since
the KV mapping (kv_media.py) rests on both.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import os
import subprocess
from array import array
from pathlib import Path

import av
import pytest
from PIL import Image
from sglang.srt.entrypoints.engine import init_tokenizer_manager
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.mm_utils import pad_mm_tokens
from sglang.srt.managers.schedule_batch import Modality, MultimodalInputs
from sglang.srt.runtime_context import publish
from sglang.srt.server_args import PortArgs, ServerArgs
from tokenizers import Tokenizer

from services.common import video_frames
from services.common.hashing import media_block_infos
from services.preprocessor.media import placement
from services.preprocessor.media.resolve import content_hash
from services.workers.engine import EngineRequest, MediaInput, RequestRejected, engine_token_ids
from services.workers.sglang import media, sampling
from services.workers.sglang.engine import SglangEngine
from services.workers.sglang.kv_events import media_pads
from tests.media_samples import mp4, png

REPO = Path(__file__).resolve().parents[3]
LIMITS = sampling.EngineLimits(max_model_len=4096, defaults={})
PAGE = 16
# SGLang's processing runs in its executors: a request it cannot process may never answer (see
# test_an_expanded_run_is_what_sglangs_processor_cannot_take), so every call is bounded.
TIMEOUT_S = 120
_rids = itertools.count()


@pytest.fixture(scope="module")
def model_dir() -> str:
    """The demo vision model, built by the main environment (the packaged tokenizer lives there); no weights."""
    python = REPO / ".venv" / "bin" / "python"
    code = "from services.models.qwen_vl import default_vision_model_dir; print(default_vision_model_dir())"
    out = subprocess.run([str(python), "-c", code], cwd=REPO, check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "gen" / "python")])})
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def tokenizer_manager(model_dir: str):
    """SGLang's tokenizer manager for the model, with its multimodal processor, as its server builds it."""
    server_args = ServerArgs(model_path=model_dir, device="cpu")
    publish(server_args, role="tokenizer")
    manager, _ = init_tokenizer_manager(server_args, PortArgs.init_new(server_args))
    return manager


@pytest.fixture(scope="module")
def tokenizer(model_dir: str) -> Tokenizer:
    return Tokenizer.from_file(f"{model_dir}/tokenizer.json")


@pytest.fixture
def engine() -> SglangEngine:
    """The worker's engine adapter, no engine started (what start() reads from one is set by hand)."""
    engine = SglangEngine(server_args=None, reasoning_parser="")
    engine._limits = LIMITS
    engine.media_pads = media_pads()
    return engine


def placed_request(model_dir: str, tokenizer: Tokenizer, parts: list[tuple[str, bytes] | str]) -> EngineRequest:
    """A user turn of text and media parts, rendered, tokenized and placed as the preprocessor does."""
    text = "".join(p if isinstance(p, str) else placement.MARKERS[p[0]] for p in parts)
    ids = tokenizer.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n",
                           add_special_tokens=False).ids
    spec = placement.load_spec(model_dir, tokenizer)
    items = [p for p in parts if not isinstance(p, str)]
    counts = [(modality, tokens(modality, raw, spec)) for modality, raw in items]
    expanded, placed = placement.expand(ids, counts, spec)
    media_items = tuple(MediaInput(modality, content=raw, content_hash=content_hash(raw), token_offset=p.offset,
                                   token_count=p.count) for (modality, raw), p in zip(items, placed, strict=True))
    return EngineRequest(request_id="r", token_ids=expanded, media=media_items, max_tokens=8)


def tokens(modality: str, raw: bytes, spec: placement.VisionSpec) -> int:
    if modality == "image":
        width, height = Image.open(io.BytesIO(raw)).size
        return placement.item_tokens("image", width, height, 0, 0.0, spec)
    with av.open(io.BytesIO(raw)) as container:
        stream = container.streams.video[0]
        width, height = stream.width, stream.height
        frames, duration = video_frames.measure(container)
    return placement.item_tokens("video", width, height, frames, duration, spec)


def sglang_tokenized(tokenizer_manager, kwargs: dict):
    """What SGLang's tokenizer manager hands its scheduler for ``async_generate(**kwargs)``."""
    obj = GenerateReqInput(**{**kwargs, "rid": f"probe-{next(_rids)}"})
    obj.normalize_batch_and_arguments()
    tokenizer_manager._init_req_state(obj)
    try:
        return asyncio.run(asyncio.wait_for(tokenizer_manager._tokenize_one_request(obj), TIMEOUT_S))
    finally:
        tokenizer_manager.rid_to_state.pop(obj.rid, None)


def assert_items_cover_the_runs(tokenized, request: EngineRequest) -> None:
    """One SGLang item per placed item, over exactly its run, hashed with its content hash."""
    got = sorted((item.offsets, item.modality, item.hash) for item in tokenized.mm_inputs.mm_items)
    want = sorted(([(m.token_offset, m.token_offset + m.token_count - 1)], Modality.from_str(m.modality),
                   m.content_hash) for m in request.media)
    assert got == want


def test_sglang_expands_the_adapters_images_to_the_mesh_prompt(model_dir, tokenizer, tokenizer_manager, engine):
    request = placed_request(model_dir, tokenizer, [("image", png(112, 112, seed=1)), "Compare with",
                                                    ("image", png(56, 84, seed=2)), "please."])
    assert [m.token_count for m in request.media] == [16, 6]
    kwargs = engine.request_kwargs(request, "r-0")
    assert len(kwargs["input_ids"]) == len(request.token_ids) - 15 - 5  # each run sent as one placeholder
    tokenized = sglang_tokenized(tokenizer_manager, kwargs)
    assert list(tokenized.input_ids) == request.token_ids
    assert_items_cover_the_runs(tokenized, request)


def test_an_expanded_run_is_what_sglangs_processor_cannot_take(model_dir, tokenizer, tokenizer_manager):
    """Why the adapter collapses each run: SGLang decodes the ids to text for transformers' processor, which
    expands each placeholder once per image; an expanded run exhausts its replacements (StopIteration, which
    SGLang's executor future cannot carry: the request would never answer)."""
    request = placed_request(model_dir, tokenizer, [("image", png(112, 112, seed=1)), "What is it?"])
    image = Image.open(io.BytesIO(request.media[0].content))
    with pytest.raises(StopIteration):
        tokenizer_manager.processor(text=[tokenizer.decode(request.token_ids, skip_special_tokens=False)],
                                    images=[image])
    collapsed = engine_token_ids(request.token_ids, request.media)
    out = tokenizer_manager.processor(text=[tokenizer.decode(collapsed, skip_special_tokens=False)], images=[image])
    assert list(out["input_ids"][0]) == request.token_ids


def test_a_video_and_images_reach_sglang_as_the_mesh_placed_them(model_dir, tokenizer, tokenizer_manager, engine):
    """An image, a video, an image: SGLang lists its items images first, and pairs mm_hashes with them in
    that order."""
    clip = mp4(80, 60, frames=10, fps=2, seed=1)
    request = placed_request(model_dir, tokenizer, [("image", png(56, 56, seed=5)), "then", ("video", clip),
                                                    "and", ("image", png(112, 84, seed=3)), "What changed?"])
    assert [m.token_count for m in request.media] == [4, 30, 12]
    kwargs = engine.request_kwargs(request, "r-0")
    assert [frames.shape for frames in kwargs["video_data"]] == [(10, 60, 80, 3)]  # 2 a second, of 10 at 2 fps
    tokenized = sglang_tokenized(tokenizer_manager, kwargs)
    assert list(tokenized.input_ids) == request.token_ids
    assert_items_cover_the_runs(tokenized, request)


def test_two_videos_are_one_sglang_item_whose_hash_names_neither(model_dir, tokenizer, tokenizer_manager, engine):
    """SGLang keeps a Qwen2-VL request's videos as one item (it splits videos per frame group only): the item
    gets a hash of its own, and the images keep theirs."""
    clip, other_clip = mp4(64, 48, frames=10, fps=2), mp4(80, 60, frames=5, fps=2, seed=1)
    request = placed_request(model_dir, tokenizer, [("video", clip), "and", ("image", png(112, 84, seed=3)),
                                                    "then", ("video", other_clip), "What changed?"])
    assert [m.token_count for m in request.media] == [20, 12, 12]
    kwargs = engine.request_kwargs(request, "r-0")
    assert [frames.shape for frames in kwargs["video_data"]] == [(10, 48, 64, 3), (4, 60, 80, 3)]  # sampled
    tokenized = sglang_tokenized(tokenizer_manager, kwargs)
    assert list(tokenized.input_ids) == request.token_ids
    video, image = request.media[0], request.media[1]
    items = sorted(((item.offsets, item.modality, item.hash) for item in tokenized.mm_inputs.mm_items),
                   key=lambda i: i[0][0])
    bundle = media.bundle_hash([video.content_hash, request.media[2].content_hash])
    assert items == [([(m.token_offset, m.token_offset + m.token_count - 1) for m in request.media[::2]],
                      Modality.VIDEO, bundle),
                     ([(image.token_offset, image.token_offset + image.token_count - 1)], Modality.IMAGE,
                      image.content_hash)]
    assert bundle not in {m.content_hash for m in request.media}


def test_sglangs_padded_prompt_maps_back_to_the_preprocessors_blocks(model_dir, tokenizer, tokenizer_manager,
                                                                      engine):
    """The KV mapping's input is SGLang's own items padded over SGLang's own ids (Qwen2-VL's pad_input_ids):
    mapped back, it is the mesh's prompt with each block salted by the items it holds."""
    request = placed_request(model_dir, tokenizer, [("video", mp4(64, 48, frames=10, fps=2)), "and",
                                                    ("image", png(56, 56, seed=4)), "x" * 40])
    tokenized = sglang_tokenized(tokenizer_manager, engine.request_kwargs(request, "r-0"))
    mm = tokenized.mm_inputs
    # Nothing padded before the caller's hashes were applied: the scheduler pads with the items' own hashes
    # (Scheduler._try_apply_padded_mm_input_ids finds none to reuse), as below.
    assert mm.padded_input_ids is None
    padded = pad_mm_tokens(array("q", tokenized.input_ids), MultimodalInputs(
        mm_items=mm.mm_items, im_token_id=mm.im_token_id, video_token_id=mm.video_token_id))
    restored = engine.media_pads.restore(padded.tolist(), PAGE)
    assert restored.unknown_pad is None and restored.blocks == len(request.token_ids) // PAGE
    assert restored.token_ids == request.token_ids[:restored.blocks * PAGE]
    infos = media_block_infos([(m.token_offset, m.token_count, m.content_hash) for m in request.media], PAGE)
    assert restored.block_mm_infos == infos + [None] * (restored.blocks - len(infos))


def test_the_card_declares_video_for_qwen2_vl_only(model_dir):
    from sglang.srt.configs.model_config import ModelConfig

    config = ModelConfig(model_dir)
    assert media.input_modalities(config) == ("image", "video")
    config.hf_config.model_type = "qwen3_vl"  # its video path (timestamps, SGLang's sampling) is not checked here
    assert media.input_modalities(config) == ("image",)


def test_an_unplaced_item_is_refused():
    request = EngineRequest(request_id="r", token_ids=[1, 2],
                            media=(MediaInput("image", content=png(), content_hash=1),))
    with pytest.raises(RequestRejected, match="no placeholder tokens"):
        media.media_kwargs(request)


def test_an_undecodable_video_is_refused():
    request = EngineRequest(request_id="r", token_ids=[1, 151656, 2],
                            media=(MediaInput("video", content=b"not a video", content_hash=1, token_offset=1,
                                              token_count=1),))
    with pytest.raises(RequestRejected, match="video could not be decoded"):
        media.media_kwargs(request)
