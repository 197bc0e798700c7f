"""The demo vision model directory: Qwen2-VL's config over the demo tokenizer, and image token counts that
the preprocessor and Qwen2-VL's own image processor agree on."""

from __future__ import annotations

import json
import time

import pytest
from PIL import Image
from tokenizers import Tokenizer

from services.models.qwen import ADDED_TOKEN_IDS, VOCAB_SIZE
from services.models.qwen_vl import MAX_PIXELS, MIN_PIXELS, NAME, build_vision_model, default_vision_model_dir
from services.preprocessor.media.placement import image_tokens, load_spec

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def model_dir():
    return default_vision_model_dir()


def test_the_config_is_qwen2_vl_over_the_demo_tokenizers_placeholder_ids(model_dir):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    assert type(config).__name__ == "Qwen2VLConfig" and config.architectures == ["Qwen2VLForConditionalGeneration"]
    assert json.loads((model_dir / "config.json").read_text())["_name_or_path"] == NAME
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert tok.get_vocab_size() == VOCAB_SIZE == config.text_config.vocab_size
    for field, token in (("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
                         ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>")):
        assert getattr(config, field) == ADDED_TOKEN_IDS[token] == tok.token_to_id(token)
    # vLLM's CPU attention needs heads of at least 64.
    assert config.text_config.hidden_size // config.text_config.num_attention_heads == 64


@pytest.mark.parametrize("size", [(112, 112), (30, 30), (640, 480), (97, 211)])
def test_the_preprocessors_image_token_count_is_qwen2_vls_own(model_dir, size):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    processor = Qwen2VLImageProcessorPil.from_pretrained(model_dir)
    grid = processor(images=[Image.new("RGB", size)], return_tensors="np")["image_grid_thw"][0]
    tokens = int(grid.prod()) // processor.merge_size ** 2
    spec = load_spec(str(model_dir), Tokenizer.from_file(str(model_dir / "tokenizer.json")))
    assert (spec.min_pixels, spec.max_pixels) == (MIN_PIXELS, MAX_PIXELS)
    assert image_tokens(size[0], size[1], spec) == tokens
    assert 4 <= tokens <= 64


def test_a_second_build_reuses_the_first(model_dir):
    start = time.monotonic()
    assert build_vision_model(model_dir) == model_dir
    assert time.monotonic() - start < 2.0
