"""The SGLang adapter's image mapping against SGLang 0.5.23's own classes (runs in .venv-sglang; no model runs).

Images travel as the bytes the preprocessor fetched, with their content hash in ``mm_hashes`` (the field
SGLang keeps for external KV routers); the card's modalities come from SGLang's own ``ModelConfig``.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from PIL import Image
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.utils.common import load_image

from services.workers.engine import EngineRequest, MediaInput
from services.workers.sglang import media, sampling

PAD = 151655
LIMITS = sampling.EngineLimits(max_model_len=4096, defaults={})
REPO = Path(__file__).resolve().parents[3]


def png(color) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (56, 56), color).save(out, format="PNG")
    return out.getvalue()


def request(*items: MediaInput) -> EngineRequest:
    return EngineRequest(request_id="r", token_ids=[1, *([PAD] * 4 * len(items)), 2], media=items)


def test_images_reach_generate_req_input_with_their_content_hashes():
    items = (MediaInput("image", content=png((255, 0, 0)), content_hash=0xAB, token_offset=1, token_count=4),
             MediaInput("image", content=png((0, 0, 255)), content_hash=0xCD, token_offset=5, token_count=4))
    kwargs = {**sampling.request_kwargs(request(*items), "rid-0", LIMITS), **media.media_kwargs(request(*items))}
    obj = GenerateReqInput(**kwargs)
    obj.normalize_batch_and_arguments()
    assert obj.input_ids == [1, PAD, PAD, 2]  # each run as one placeholder: SGLang expands it (media.py)
    assert obj.mm_hashes == ["00000000000000ab", "00000000000000cd"]
    assert [int(h, 16) for h in obj.mm_hashes] == [0xAB, 0xCD]  # how SGLang's tokenizer manager reads them
    # SGLang's own loader decodes the bytes into the image that was sent.
    decoded, _ = load_image(obj.image_data[1], gpu_image_decode=False)
    assert decoded.size == (56, 56) and decoded.convert("RGB").getpixel((0, 0)) == (0, 0, 255)


def test_a_text_request_adds_nothing():
    assert media.media_kwargs(EngineRequest(request_id="r", token_ids=[1, 2])) == {}


@pytest.fixture
def model_dirs(tmp_path):
    """Config-only copies of the demo models (SGLang's ModelConfig reads config.json)."""
    vl = tmp_path / "vl"
    vl.mkdir()
    from services.models.qwen_vl import model_config

    (vl / "config.json").write_text(json.dumps(model_config()))
    text = tmp_path / "text"
    text.mkdir()
    from services.models.qwen import model_config as text_config

    (text / "config.json").write_text(json.dumps(text_config("meshfront/demo-qwen", 4096)))
    for d in (vl, text):
        shutil.copy(REPO / "services" / "models" / "templates" / "qwen_hermes.jinja", d / "chat_template.jinja")
    return vl, text


def test_the_card_declares_images_and_videos_from_sglangs_model_config(model_dirs):
    vl, text = model_dirs
    assert media.input_modalities(ModelConfig(str(vl))) == ("image", "video")
    assert media.input_modalities(ModelConfig(str(text))) == ()
