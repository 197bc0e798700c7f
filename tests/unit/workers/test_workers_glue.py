"""The shared worker glue without a network: TokenStream coalescing, proto conversions, config parsing."""

from __future__ import annotations

import asyncio

import pytest
from meshfront.common.v1 import common_pb2
from meshfront.worker.v1 import worker_pb2

from services.common.errors import InvalidRequest, WorkerFailed
from services.workers import convert
from services.workers.config import ConfigError
from services.workers.engine import EngineError, EngineOutput, FinishReason, RequestRejected, TokenLogprob, TokenStream
from services.workers.mocker.config import parse_config
from services.workers.model_dir import read_model_info
from services.workers.server import worker_card

pytestmark = pytest.mark.unit


async def test_token_stream_hands_over_everything_ready_in_one_output():
    stream = TokenStream()
    stream.set_prompt_info(12, 4)
    for t in (1, 2, 3):
        stream.push(t)
    first = await anext(stream)
    assert first.token_ids == [1, 2, 3]
    assert (first.prompt_tokens, first.cached_tokens) == (12, 4)
    stream.push(4)
    stream.push(5, finish=FinishReason.EOS)
    stream.push(6)  # after the finish: dropped
    last = await anext(stream)
    assert last.token_ids == [4, 5] and last.finish_reason is FinishReason.EOS
    assert last.prompt_tokens is None
    with pytest.raises(StopAsyncIteration):
        await anext(stream)


async def test_token_stream_waits_for_the_producer():
    stream = TokenStream(logprobs=True)
    pending = asyncio.create_task(anext(stream))
    await asyncio.sleep(0)
    assert not pending.done()
    stream.push(7, TokenLogprob(7, -0.5, ((7, -0.5),)))
    out = await asyncio.wait_for(pending, 1)
    assert out.token_ids == [7] and out.logprobs == [TokenLogprob(7, -0.5, ((7, -0.5),))]


async def test_token_stream_delivers_pending_tokens_before_an_error():
    stream = TokenStream()
    stream.push(1)
    stream.fail(EngineError("boom"))
    assert (await anext(stream)).token_ids == [1]
    with pytest.raises(EngineError):
        await anext(stream)
    with pytest.raises(StopAsyncIteration):
        await anext(stream)


async def test_a_closed_token_stream_ignores_its_producer():
    stream = TokenStream()
    stream.close()
    stream.push(1)
    stream.finish(FinishReason.LENGTH)
    assert stream.closed


def test_request_from_proto_keeps_unset_distinct_from_zero():
    request = worker_pb2.GenerateRequest(request=common_pb2.PreprocessedRequest(
        request_id="abc", token_ids=[5, 6, 7], eos_token_ids=[9],
        sampling=common_pb2.SamplingOptions(temperature=0.0, seed=3),
        stop=common_pb2.StopConditions(max_tokens=10, min_tokens=2),
        output=common_pb2.OutputOptions(logprobs=0)))
    r = convert.request_from_proto(request)
    assert r.request_id == "abc" and list(r.token_ids) == [5, 6, 7]
    assert r.sampling.temperature == 0.0 and r.sampling.top_p is None and r.sampling.seed == 3
    assert (r.max_tokens, r.min_tokens, r.eos_token_ids, r.ignore_eos) == (10, 2, (9,), False)
    assert r.logprobs == 0

    bare = convert.request_from_proto(worker_pb2.GenerateRequest(request=common_pb2.PreprocessedRequest(
        token_ids=[1], eos_token_ids=[9], stop=common_pb2.StopConditions(ignore_eos=True))))
    assert bare.max_tokens is None and bare.logprobs is None
    assert bare.eos_token_ids == () and bare.ignore_eos


def test_hidden_stop_ids_other_than_eos_reach_the_engine_as_stop_ids():
    stop = common_pb2.StopConditions(stop_token_ids_hidden=[9, 4, 5])  # the preprocessor folds EOS in
    r = convert.request_from_proto(worker_pb2.GenerateRequest(request=common_pb2.PreprocessedRequest(
        token_ids=[1], eos_token_ids=[9], stop=stop)))
    assert (r.eos_token_ids, r.stop_token_ids) == ((9,), (4, 5))


@pytest.mark.parametrize(("guided", "kind"), [
    (common_pb2.GuidedDecoding(json_schema="{}"), "json_schema"),
    (common_pb2.GuidedDecoding(json_object=True), "json_object"),
    (common_pb2.GuidedDecoding(regex="a+"), "regex"),
    (common_pb2.GuidedDecoding(choice=["a", "b"]), "choice"),
    (common_pb2.GuidedDecoding(grammar="root ::= x"), "grammar"),
])
def test_every_guided_decoding_kind_reaches_the_engine(guided, kind):
    r = convert.request_from_proto(worker_pb2.GenerateRequest(request=common_pb2.PreprocessedRequest(
        token_ids=[1], sampling=common_pb2.SamplingOptions(guided_decoding=guided))))
    assert r.guided is not None and r.guided.kind() == kind


def test_two_guided_decoding_kinds_at_once_are_refused():
    guided = common_pb2.GuidedDecoding(regex="a+", choice=["a"])
    with pytest.raises(InvalidRequest, match="regex and choice"):
        convert.request_from_proto(worker_pb2.GenerateRequest(request=common_pb2.PreprocessedRequest(
            token_ids=[1], sampling=common_pb2.SamplingOptions(guided_decoding=guided))))


def test_output_to_proto_sets_usage_only_when_known():
    first = convert.output_to_proto(EngineOutput([1, 2], prompt_tokens=10, cached_tokens=0,
                                                 logprobs=[TokenLogprob(1, -0.1, ((1, -0.1), (3, -2.0)))]))
    assert list(first.token_ids) == [1, 2] and first.prompt_tokens == 10
    assert first.logprobs[0].top[1].token_id == 3
    last = convert.output_to_proto(EngineOutput([], FinishReason.EOS))
    assert last.finish_reason == common_pb2.FINISH_REASON_EOS and last.prompt_tokens == 0


def test_finish_reasons_match_the_proto_enum():
    for reason in FinishReason:
        name = "UNSPECIFIED" if reason is FinishReason.NONE else reason.name
        assert common_pb2.FinishReason.Value(f"FINISH_REASON_{name}") == reason


def test_engine_errors_map_to_mesh_errors():
    assert isinstance(convert.engine_error(RequestRejected("too long")), InvalidRequest)
    assert isinstance(convert.engine_error(EngineError("died")), WorkerFailed)


def test_mocker_config_defaults_and_model_facts(model_dir):
    cfg = parse_config(["--model-dir", str(model_dir)], env={})
    assert cfg.worker.model_name == model_dir.name
    assert cfg.worker.worker_id.startswith("mocker-") and len(cfg.worker.worker_id) == len("mocker-") + 8
    assert cfg.worker.register and cfg.worker.context_length == 4096 == cfg.engine.context_length
    assert (cfg.engine.block_size, cfg.engine.num_gpu_blocks, cfg.engine.max_num_seqs) == (16, 16384, 256)
    assert cfg.engine.max_num_batched_tokens == 8192 and cfg.engine.speedup_ratio == 1.0
    assert read_model_info(model_dir).eos_token_ids == (151645, 151643)


def test_mocker_config_flags_and_env_twins(model_dir):
    env = {"MESHFRONT_MOCKER_SPEEDUP_RATIO": "0", "MESHFRONT_MOCKER_NUM_GPU_BLOCKS": "64"}
    cfg = parse_config(["--model-dir", str(model_dir), "--model-name", "demo", "--worker-id", "w1",
                        "--no-register", "--num-gpu-blocks", "128", "--output-text", "hi"], env=env)
    assert cfg.engine.speedup_ratio == 0 and cfg.engine.num_gpu_blocks == 128  # flag beats env
    assert cfg.worker.worker_id == "w1" and not cfg.worker.register and cfg.engine.output_text == "hi"
    card = worker_card(cfg.worker, "127.0.0.1:5000", total_kv_blocks=128, max_num_batched_tokens=8192)
    assert card.kind == "mocker" and card.model.name == "demo" and card.model.context_length == 4096
    assert card.to_json() and card.address == "127.0.0.1:5000"


def test_mocker_config_reports_every_problem(tmp_path):
    with pytest.raises(ConfigError) as e:
        parse_config(["--model-dir", str(tmp_path / "missing"), "--speedup-ratio", "-1", "--block-size", "0",
                      "--script", str(tmp_path / "nope.json")], env={})
    assert [m.split()[0] for m in e.value.errors] == ["--model-dir", "--block-size", "--speedup-ratio", "--script"]
