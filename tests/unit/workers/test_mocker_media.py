"""The mocker's image and audio support: placeholder tokens per item, refused when not declared."""

from __future__ import annotations

import pytest
from meshfront.common.v1 import common_pb2
from meshfront.worker.v1 import worker_pb2

from services.common.errors import InvalidRequest
from services.workers import convert
from services.workers.config import ConfigError
from services.workers.engine import EngineRequest, MediaInput, RequestRejected
from services.workers.mocker.config import MockerEngineConfig, parse_config
from services.workers.mocker.engine import MockerEngine
from services.workers.mocker.outputs import OutputPolicy
from services.workers.service import WorkerService

pytestmark = pytest.mark.unit

CAT = MediaInput("image", url="https://x.org/cat.png")
DOG = MediaInput("image", url="https://x.org/dog.png")


async def first_output(engine: MockerEngine, request: EngineRequest):
    outputs = [o async for o in engine.generate(request)]
    return outputs[0]


async def test_each_image_is_a_fixed_number_of_prompt_tokens_and_reuses_its_cache(tokenizer, clock):
    cfg = MockerEngineConfig(speedup_ratio=0.0, input_modalities=("image", "audio"), image_tokens=48,
                             audio_tokens=16)
    engine = MockerEngine(cfg, OutputPolicy.build(tokenizer), clock=clock)
    try:
        prompt = list(range(1000, 1032))
        plain = await first_output(engine, EngineRequest("a", prompt, max_tokens=1))
        one = await first_output(engine, EngineRequest("b", prompt, max_tokens=1, media=(CAT,)))
        both = await first_output(engine, EngineRequest(
            "c", prompt, max_tokens=1, media=(CAT, MediaInput("audio", data="AAAA", format="wav"))))
        assert (plain.prompt_tokens, one.prompt_tokens, both.prompt_tokens) == (32, 80, 96)
        again = await first_output(engine, EngineRequest("d", prompt, max_tokens=1, media=(CAT,)))
        other = await first_output(engine, EngineRequest("e", prompt, max_tokens=1, media=(DOG,)))
        assert again.cached_tokens == 80  # the same image: the same placeholder blocks, cached
        assert other.cached_tokens == 32  # another image: only the text prefix
    finally:
        await engine.close()


async def test_undeclared_media_are_refused(tokenizer, clock):
    engine = MockerEngine(MockerEngineConfig(speedup_ratio=0.0), OutputPolicy.build(tokenizer), clock=clock)
    with pytest.raises(RequestRejected, match="does not accept image input"):
        await first_output(engine, EngineRequest("a", [1000, 1001], max_tokens=1, media=(CAT,)))
    await engine.close()
    service = WorkerService(engine, input_modalities=())
    request = worker_pb2.GenerateRequest(request=common_pb2.PreprocessedRequest(
        request_id="r", token_ids=[1000], media=[common_pb2.MediaItem(modality="audio", data="AAAA")]))
    with pytest.raises(InvalidRequest, match="does not accept audio input"):
        await anext(service.generate(request))


def test_media_and_thinking_budget_reach_the_engine_request():
    r = convert.request_from_proto(worker_pb2.GenerateRequest(request=common_pb2.PreprocessedRequest(
        request_id="r", token_ids=[1], stop=common_pb2.StopConditions(max_thinking_tokens=9),
        media=[common_pb2.MediaItem(modality="image", url="https://x.org/a.png")])))
    assert r.media == (MediaInput("image", url="https://x.org/a.png"),) and r.max_thinking_tokens == 9


def test_mocker_flags_declare_modalities(demo_model_dir):
    cfg = parse_config(["--model-dir", str(demo_model_dir), "--input-modalities", "image, audio",
                        "--image-tokens", "10"], {})
    assert cfg.worker.input_modalities == ("image", "audio") == cfg.engine.input_modalities
    assert cfg.engine.image_tokens == 10
    assert parse_config(["--model-dir", str(demo_model_dir)], {}).worker.input_modalities == ()
    with pytest.raises(ConfigError, match="video"):
        parse_config(["--model-dir", str(demo_model_dir), "--input-modalities", "video"], {})
