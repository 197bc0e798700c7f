"""The mocker's image, video and audio support: placeholder tokens per item, salted KV blocks, refused when not
declared."""

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
    video = parse_config(["--model-dir", str(demo_model_dir), "--input-modalities", "video"], {})
    assert video.engine.input_modalities == ("video",)
    with pytest.raises(ConfigError, match="smell"):
        parse_config(["--model-dir", str(demo_model_dir), "--input-modalities", "smell"], {})


# --- items the preprocessor placed (token_offset/token_count): their blocks are salted with content_hash ---

PAD = 151655


def placed(content_hash: int, offset: int, count: int) -> MediaInput:
    return MediaInput("image", content_hash=content_hash, token_offset=offset, token_count=count, content=b"x")


async def test_placed_images_are_not_appended_and_salt_their_blocks(tokenizer, clock):
    from services.common.hashing import block_hashes, media_block_infos, sequence_hashes

    cfg = MockerEngineConfig(speedup_ratio=0.0, input_modalities=("image",), image_tokens=48)
    engine = MockerEngine(cfg, OutputPolicy.build(tokenizer), clock=clock)
    try:
        prompt = list(range(1000, 1020)) + [PAD] * 40 + list(range(2000, 2012))  # 72 tokens, image at 20..59
        a = await first_output(engine, EngineRequest("a", prompt, max_tokens=1, media=(placed(7, 20, 40),)))
        assert a.prompt_tokens == 72  # already in the prompt: nothing appended
        again = await first_output(engine, EngineRequest("b", prompt, max_tokens=1, media=(placed(7, 20, 40),)))
        assert again.cached_tokens == 64  # every full block, the image's included
        other = await first_output(engine, EngineRequest("c", prompt, max_tokens=1, media=(placed(8, 20, 40),)))
        assert other.cached_tokens == 16  # only the block before the image
        # The blocks it stored are the ones the preprocessor's salted hashes name for the router.
        expected = sequence_hashes(block_hashes(prompt, 16, block_mm_infos=media_block_infos([(20, 40, 7)], 16)))
        assert all(engine.cache.contains(h) for h in expected)
        with pytest.raises(RequestRejected, match="past the prompt"):
            await first_output(engine, EngineRequest("d", prompt, max_tokens=1, media=(placed(7, 60, 40),)))
    finally:
        await engine.close()


def test_the_full_media_contract_reaches_the_engine_request():
    item = common_pb2.MediaItem(modality="image", content=b"\x89PNG", mime_type="image/png", content_hash=5,
                                uuid="u1", token_offset=3, token_count=4, width=28, height=56)
    r = convert.request_from_proto(worker_pb2.GenerateRequest(request=common_pb2.PreprocessedRequest(
        request_id="r", token_ids=[1] * 8, media=[item])))
    assert r.media == (MediaInput("image", content=b"\x89PNG", mime_type="image/png", content_hash=5, uuid="u1",
                                  token_offset=3, token_count=4, width=28, height=56),)


def test_a_block_that_fills_while_decoding_keeps_its_image_salt():
    from services.common.hashing import block_hashes, media_block_infos, sequence_hashes
    from services.workers.mocker.sequence import Sequence, full_blocks

    prompt = list(range(1000, 1030)) + [PAD] * 10  # 40 tokens; the image's run 30..39 spills into block 2
    infos = media_block_infos([(30, 10, 99)], 16)
    seq = Sequence("r", prompt, plan=None, prompt_blocks=full_blocks(prompt, 16, infos), mm_infos=infos)
    seq.held = list(seq.prompt_blocks)
    seq.output = list(range(5000, 5008))  # block 2 (positions 32..47) is full now
    tail = seq.tail_block(16)
    everything = prompt + seq.output
    assert tail.tokens_hash == block_hashes(everything, 16, block_mm_infos=infos)[2]
    assert tail.block_hash == sequence_hashes(block_hashes(everything, 16, block_mm_infos=infos))[2]
    assert tail.tokens_hash != block_hashes(everything, 16)[2]
