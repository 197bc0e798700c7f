"""What SGLang 0.5.23 makes of the SGLang worker's audio requests, on its own multimodal processor (runs in
.venv-sglang, on a CPU; no model runs).

As test_sglang_mm_processor.py for images and videos, with the demo audio model (services/models/qwen_audio.py)
and SGLang's ``Qwen2AudioMultimodalProcessor``: the request the worker's engine adapter builds from a prompt the
preprocessor placed goes through SGLang's ``TokenizerManager._tokenize_one_request``; its ``input_ids`` must be
the mesh's, token for token, with one ``mm_items`` entry per clip over exactly its run, carrying the clip's
content hash. SGLang decodes audio itself (PyAV for containers it recognises, else torchcodec or soundfile):
the adapter sends the samples the preprocessor counted, in a container SGLang decodes back unchanged.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
from array import array
from pathlib import Path

import numpy as np
import pytest
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.entrypoints.engine import init_tokenizer_manager
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.mm_utils import pad_mm_tokens
from sglang.srt.managers.schedule_batch import Modality, MultimodalInputs
from sglang.srt.multimodal.audio_from_video import decode_audio_container
from sglang.srt.runtime_context import publish
from sglang.srt.server_args import PortArgs, ServerArgs
from tokenizers import Tokenizer

from services.common import audio_samples
from services.common.hashing import media_block_infos
from services.preprocessor.media import placement
from services.preprocessor.media.resolve import content_hash
from services.workers.engine import EngineRequest, MediaInput, RequestRejected
from services.workers.sglang import media, sampling
from services.workers.sglang.engine import SglangEngine
from services.workers.sglang.kv_events import media_pads
from tests.media_samples import mp3, wav

REPO = Path(__file__).resolve().parents[3]
LIMITS = sampling.EngineLimits(max_model_len=4096, defaults={})
PAGE = 16
TIMEOUT_S = 120
_rids = itertools.count()


def built(function: str) -> str:
    """A demo model directory, built by the main environment (the packaged tokenizer lives there); no weights."""
    python = REPO / ".venv" / "bin" / "python"
    module, name = function.rsplit(".", 1)
    code = f"from {module} import {name}; print({name}())"
    out = subprocess.run([str(python), "-c", code], cwd=REPO, check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "gen" / "python")])})
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def model_dir() -> str:
    return built("services.models.qwen_audio.default_audio_model_dir")


@pytest.fixture(scope="module")
def tokenizer_manager(model_dir: str):
    server_args = ServerArgs(model_path=model_dir, device="cpu")
    publish(server_args, role="tokenizer")
    manager, _ = init_tokenizer_manager(server_args, PortArgs.init_new(server_args))
    return manager


@pytest.fixture(scope="module")
def tokenizer(model_dir: str) -> Tokenizer:
    return Tokenizer.from_file(f"{model_dir}/tokenizer.json")


@pytest.fixture
def engine() -> SglangEngine:
    engine = SglangEngine(server_args=None, reasoning_parser="")
    engine._limits = LIMITS
    engine.media_pads = media_pads()
    return engine


def placed_request(model_dir: str, tokenizer: Tokenizer, parts: list[tuple[str, bytes] | str]) -> EngineRequest:
    """A user turn of text and audio parts ``(format, bytes)``, rendered, tokenized and placed as the preprocessor
    does (it counts a clip's tokens from the samples audio_samples decodes)."""
    text = "".join(p if isinstance(p, str) else placement.MARKERS["audio"] for p in parts)
    ids = tokenizer.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n",
                           add_special_tokens=False).ids
    spec = placement.load_spec(model_dir, tokenizer)
    clips = [p for p in parts if not isinstance(p, str)]
    counts = [("audio", placement.item_tokens("audio", 0, 0, 0, 0.0, spec, samples=len(
        audio_samples.decode(raw, fmt, audio_samples.SAMPLING_RATE, 60)))) for fmt, raw in clips]
    expanded, placed = placement.expand(ids, counts, spec)
    items = tuple(MediaInput("audio", content=raw, format=fmt, content_hash=content_hash(raw), token_offset=p.offset,
                             token_count=p.count) for (fmt, raw), p in zip(clips, placed, strict=True))
    return EngineRequest(request_id="r", token_ids=expanded, media=items, max_tokens=8)


def sglang_tokenized(tokenizer_manager, kwargs: dict):
    obj = GenerateReqInput(**{**kwargs, "rid": f"probe-{next(_rids)}"})
    obj.normalize_batch_and_arguments()
    tokenizer_manager._init_req_state(obj)
    try:
        return asyncio.run(asyncio.wait_for(tokenizer_manager._tokenize_one_request(obj), TIMEOUT_S))
    finally:
        tokenizer_manager.rid_to_state.pop(obj.rid, None)


def test_sglang_expands_the_adapters_audio_to_the_mesh_prompt(model_dir, tokenizer, tokenizer_manager, engine):
    request = placed_request(model_dir, tokenizer, [("wav", wav(1.3, seed=1)), "and then",
                                                    ("mp3", mp3(0.7, seed=2)), "What do you hear?"])
    assert [m.token_count for m in request.media] == [32, 17]
    kwargs = engine.request_kwargs(request, "r-0")
    assert len(kwargs["input_ids"]) == len(request.token_ids) - 31 - 16  # each run sent as one placeholder
    tokenized = sglang_tokenized(tokenizer_manager, kwargs)
    assert list(tokenized.input_ids) == request.token_ids
    got = [(item.offsets, item.modality, item.hash) for item in tokenized.mm_inputs.mm_items]
    assert got == [([(m.token_offset, m.token_offset + m.token_count - 1)], Modality.AUDIO, m.content_hash)
                   for m in request.media]


def test_sglang_decodes_the_sent_clip_to_the_samples_the_preprocessor_counted():
    raw = wav(0.9, rate=44100, channels=2, seed=3)
    samples = audio_samples.decode(raw, "wav", audio_samples.SAMPLING_RATE, 60)
    sent = media.audio_container(samples)
    # What SGLang's load_audio does with bytes in a container it recognises (the Matroska signature).
    got = decode_audio_container(sent, target_sr=audio_samples.SAMPLING_RATE, mono=True)
    assert np.array_equal(got, samples)


def test_sglangs_padded_audio_prompt_maps_back_to_the_preprocessors_blocks(model_dir, tokenizer, tokenizer_manager,
                                                                            engine):
    request = placed_request(model_dir, tokenizer, [("wav", wav(1.0, seed=4)), "x" * 60])
    tokenized = sglang_tokenized(tokenizer_manager, engine.request_kwargs(request, "r-0"))
    mm = tokenized.mm_inputs
    # Nothing padded before the caller's hashes were applied: the scheduler pads with the items' own hashes
    # (Scheduler._try_apply_padded_mm_input_ids finds none to reuse), as below.
    assert mm.padded_input_ids is None
    padded = pad_mm_tokens(array("q", tokenized.input_ids),
                           MultimodalInputs(mm_items=mm.mm_items, audio_token_id=mm.audio_token_id))
    restored = engine.media_pads.restore(padded.tolist(), PAGE)
    assert restored.unknown_pad is None and restored.blocks == len(request.token_ids) // PAGE
    assert restored.token_ids == request.token_ids[:restored.blocks * PAGE]
    infos = media_block_infos([(m.token_offset, m.token_count, m.content_hash) for m in request.media], PAGE)
    assert restored.block_mm_infos == infos + [None] * (restored.blocks - len(infos))


def test_the_card_declares_audio_for_qwen2_audio(model_dir, tmp_path):
    assert media.input_modalities(ModelConfig(model_dir)) == ("audio",)
    text = tmp_path / "text"
    text.mkdir()
    from services.models.qwen import model_config

    (text / "config.json").write_text(json.dumps(model_config("meshfront/demo-qwen", 4096)))
    assert media.input_modalities(ModelConfig(str(text))) == ()


def test_undecodable_audio_is_refused():
    request = EngineRequest(request_id="r", token_ids=[1, 151670, 2], media=(
        MediaInput("audio", content=b"not audio", format="wav", content_hash=1, token_offset=1, token_count=1),))
    with pytest.raises(RequestRejected, match="audio clip could not be decoded"):
        media.media_kwargs(request)
