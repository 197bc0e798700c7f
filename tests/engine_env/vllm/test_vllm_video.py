"""Video through vLLM 0.32's CPU build (runs in .venv-vllm): the PIL video processor, the adapter's mapping, and
one real engine serving the demo vision model with video prompts placed the way the preprocessor places them.

The engine is vLLM's offline ``LLM`` on the demo model's directory (services/models/qwen_vl.py), with the worker's
processor shim (services/workers/vllm/without_torchvision) installed as the worker installs it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from tokenizers import Tokenizer

from services.common import video_frames
from services.launcher.run import VLLM_CPU_KV_CACHE_BYTES
from services.models.qwen_vl import default_vision_model_dir
from services.preprocessor.media import decode, placement
from services.workers.engine import MediaInput, RequestRejected, engine_token_ids
from services.workers.vllm import media
from tests.media_samples import mp4, png

# The engine's start takes minutes on a loaded CPU (its multimodal warm-up alone took 210 s).
pytestmark = pytest.mark.timeout(1800)

media.enable_pil_processors()  # before transformers' Qwen2-VL modules load, as the worker does

BLOCK = 128  # vLLM's CPU block size
PROMPT = "<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>What happens in this clip?<|im_end|>\n"


@pytest.fixture(scope="module")
def model_dir():
    return default_vision_model_dir(with_weights=True)


def test_the_pil_video_processor_lays_out_patches_as_transformers_does(model_dir):
    from transformers.models.qwen2_vl import Qwen2VLProcessor

    processor = Qwen2VLProcessor.from_pretrained(str(model_dir))
    rng = np.random.default_rng(0)
    a, b = (rng.integers(0, 255, (60, 80, 3), dtype=np.uint8) for _ in range(2))
    video = processor.video_processor(videos=[np.stack([a, a, b])], return_tensors="np")
    image = processor.image_processor(images=[a], return_tensors="np")
    # Three frames pad to two temporal patches; 60x80 resizes to 56x84: a 4x6 patch grid.
    assert video["video_grid_thw"].tolist() == [[2, 4, 6]]
    assert video["pixel_values_videos"].shape == (48, 3 * 2 * 14 * 14)
    # An image is a temporal patch of one frame twice: the clip's first patch (frames a, a) is exactly it.
    assert np.array_equal(video["pixel_values_videos"][:24], image["pixel_values"])
    # ... and the second patch (b, b-repeated) is b's image patch.
    image_b = processor.image_processor(images=[b], return_tensors="np")["pixel_values"]
    assert np.array_equal(video["pixel_values_videos"][24:], image_b)
    with pytest.raises(ValueError, match="does not sample frames"):
        processor.video_processor(videos=[np.stack([a, b])], do_sample_frames=True)


def test_the_video_processor_reads_a_video_preprocessor_config(model_dir, tmp_path):
    from transformers.models.qwen2_vl import Qwen2VLProcessor

    for f in model_dir.iterdir():
        if f.is_file() and f.suffix in (".json", ".jinja"):
            (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps(
        {"video_processor_type": "Qwen2VLVideoProcessor", "min_pixels": 112 * 112, "max_pixels": 112 * 112}))
    processor = Qwen2VLProcessor.from_pretrained(str(tmp_path))
    out = processor.video_processor(videos=[np.zeros((2, 56, 56, 3), np.uint8)], return_tensors="np")
    assert out["video_grid_thw"].tolist() == [[1, 8, 8]]  # scaled up to 112x112, as its own bounds say
    assert processor.image_processor.size["longest_edge"] == 224 * 224  # images keep preprocessor_config.json's


def test_a_video_becomes_its_sampled_frames_and_a_content_uuid():
    clip = mp4(64, 48, frames=10, fps=2)
    fields = media.multimodal_fields([MediaInput("video", content=clip, content_hash=0xBEEF)])
    frames = fields["multi_modal_data"]["video"][0]
    assert frames.shape == (10, 48, 64, 3)
    assert fields["multi_modal_uuids"] == {"video": ["xxh3:000000000000beef"]}
    assert "mm_processor_kwargs" not in fields  # those would make vLLM hash the uuid again (media.py)
    with pytest.raises(RequestRejected, match="video could not be decoded"):
        media.multimodal_fields([MediaInput("video", content=b"not a video", content_hash=1)])


def test_placed_runs_reach_vllm_as_one_placeholder_each():
    items = [MediaInput("image", token_offset=1, token_count=3), MediaInput("audio"),
             MediaInput("video", token_offset=6, token_count=2)]
    assert engine_token_ids([1, 9, 9, 9, 2, 3, 8, 8, 4], items) == [1, 9, 2, 3, 8, 4]
    assert engine_token_ids([1, 2], [MediaInput("audio")]) == [1, 2]  # nothing placed: as sent


@pytest.fixture(scope="module")
def llm(model_dir):
    from vllm import LLM

    engine = LLM(model=str(model_dir), kv_cache_memory_bytes=VLLM_CPU_KV_CACHE_BYTES, max_model_len=1024,
                 enforce_eager=True, limit_mm_per_prompt={"image": 1, "video": 1}, skip_mm_profiling=True,
                 max_num_seqs=2)
    yield engine
    del engine


def placed(model_dir, clip: bytes, content_hash: int) -> tuple[list[int], MediaInput]:
    """The prompt's token ids and the video item, as the preprocessor builds them (decode.py, placement.py)."""
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    spec = placement.load_spec(str(model_dir), tokenizer)
    info = decode.decode_video(clip)
    count = placement.item_tokens("video", info.width, info.height, info.frames, info.duration_s, spec)
    ids, [where] = placement.expand(tokenizer.encode(PROMPT, add_special_tokens=False).ids, [("video", count)], spec)
    return ids, MediaInput("video", content=clip, content_hash=content_hash, token_offset=where.offset,
                           token_count=where.count)


def worker_prompt(ids: list[int], items: list[MediaInput]):
    """The prompt the vLLM worker gives vLLM (services/workers/vllm/engine.py)."""
    from vllm.inputs import TokensPrompt

    prompt = TokensPrompt(prompt_token_ids=engine_token_ids(ids, items))
    prompt.update(media.multimodal_fields(items))  # type: ignore[typeddict-item]
    return prompt


def run(llm, prompt) -> object:
    from vllm import SamplingParams

    [out] = llm.generate(prompt, SamplingParams(max_tokens=4, temperature=0), use_tqdm=False)
    return out


def test_a_video_prompt_runs_with_the_preprocessors_count_and_caches(llm, model_dir):
    assert media.input_modalities(llm.llm_engine.model_config) == ("image", "video")
    # 8 s at 8 fps: 16 of its 64 frames sampled (2 a second), 8 temporal patches of 4x4 merged 28-px tiles.
    clip = mp4(112, 112, frames=64, fps=8)
    ids, item = placed(model_dir, clip, 0xC11F)
    assert item.token_count == 8 * 16 and len(ids) > BLOCK  # the video fills most of the prompt's first block

    prompt = worker_prompt(ids, [item])
    first = run(llm, prompt)
    # vLLM expanded the collapsed placeholder to the preprocessor's count: its prompt is the mesh's.
    assert list(first.prompt_token_ids) == ids and len(first.outputs[0].token_ids) == 4

    # vLLM's own placement of the same frames, from the unexpanded text: the same prompt, token for token.
    own = run(llm, {"prompt": PROMPT, "multi_modal_data": {"video": video_frames.decode_sampled(clip)}})
    assert list(own.prompt_token_ids) == ids

    # The same video again: the first block, holding the video, is in vLLM's prefix cache (the uuid names the
    # same item) ...
    again = run(llm, prompt)
    assert again.num_cached_tokens >= BLOCK
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    # ... and a different video in the same place shares nothing: the video starts in the first block.
    other_ids, other = placed(model_dir, mp4(112, 112, frames=64, fps=8, seed=1), 0x0DD)
    assert other_ids == ids
    assert run(llm, worker_prompt(other_ids, [other])).num_cached_tokens == 0


def test_an_image_prompt_is_the_meshs_too(llm, model_dir):
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    spec = placement.load_spec(str(model_dir), tokenizer)
    text = PROMPT.replace("video_pad", "image_pad").replace("clip", "picture")
    count = placement.item_tokens("image", 112, 112, 0, 0.0, spec)
    ids, [where] = placement.expand(tokenizer.encode(text, add_special_tokens=False).ids, [("image", count)], spec)
    item = MediaInput("image", content=png(112, 112), content_hash=0x1A, token_offset=where.offset,
                      token_count=where.count)
    out = run(llm, worker_prompt(ids, [item]))
    assert count == 16 and list(out.prompt_token_ids) == ids  # 2N - 1 placeholders without the collapse
