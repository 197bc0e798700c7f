"""The mocker behind a real gRPC server: coalesced messages, cancellation, cache hits, errors."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from meshfront.common.v1 import common_pb2
from meshfront.worker.v1 import worker_pb2

from services.common.errors import InvalidRequest, from_rpc_error
from services.workers.model_dir import load_tokenizer

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]


def generate_request(prompt, rid: str = "r", **stop) -> worker_pb2.GenerateRequest:
    return worker_pb2.GenerateRequest(request=common_pb2.PreprocessedRequest(
        request_id=rid, model="demo", token_ids=list(prompt), eos_token_ids=[151645, 151643],
        stop=common_pb2.StopConditions(**stop)))


async def read_all(call) -> list[worker_pb2.GenerateResponse]:
    return [m async for m in call]


async def test_an_instant_engine_sends_many_tokens_per_message(start_mocker):
    worker = await start_mocker("--speedup-ratio", "0")
    messages = await asyncio.wait_for(read_all(worker.stub.Generate(generate_request(range(100), max_tokens=64))), 10)
    counts = [len(m.token_ids) for m in messages]
    assert sum(counts) == 64
    assert len(messages) < 64 / 4, counts
    assert messages[0].prompt_tokens == 100
    assert messages[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert all(m.finish_reason == common_pb2.FINISH_REASON_UNSPECIFIED for m in messages[:-1])


async def test_a_paced_engine_streams_token_by_token(start_mocker):
    worker = await start_mocker("--speedup-ratio", "2")
    messages = await asyncio.wait_for(read_all(worker.stub.Generate(generate_request(range(20), max_tokens=8))), 10)
    assert sum(len(m.token_ids) for m in messages) == 8
    assert len(messages) >= 4  # ~3 ms between tokens: the reader keeps up


async def test_cancelling_the_call_aborts_and_frees_kv_blocks(start_mocker):
    worker = await start_mocker("--speedup-ratio", "1")
    call = worker.stub.Generate(generate_request(range(200), max_tokens=3000))
    first = await asyncio.wait_for(call.read(), 10)
    assert first.token_ids
    assert worker.engine.cache.active_blocks > 0
    call.cancel()
    deadline = asyncio.get_running_loop().time() + 5
    while worker.engine.cache.active_blocks or worker.engine.scheduler.has_work():
        assert asyncio.get_running_loop().time() < deadline, "cancel did not free the sequence's blocks"
        await asyncio.sleep(0.01)
    assert worker.engine.cache.cached_blocks > 0  # the prompt stays cached for the next request


async def test_a_repeated_prompt_reports_cached_tokens(start_mocker):
    worker = await start_mocker("--speedup-ratio", "0")
    prompt = list(range(5000, 5070))
    first = await read_all(worker.stub.Generate(generate_request(prompt, "a", max_tokens=4)))
    second = await read_all(worker.stub.Generate(generate_request(prompt, "b", max_tokens=4)))
    assert first[0].cached_tokens == 0
    assert second[0].cached_tokens == 64
    assert [t for m in first for t in m.token_ids] == [t for m in second for t in m.token_ids]


async def test_script_mode_answers_in_text_and_ends_with_eos(start_mocker, model_dir):
    tokenizer = load_tokenizer(model_dir)
    worker = await start_mocker("--speedup-ratio", "0", "--output-text", "Scripted reply.")
    messages = await read_all(worker.stub.Generate(
        generate_request(tokenizer.encode("hello").ids, max_tokens=100)))
    tokens = [t for m in messages for t in m.token_ids]
    assert tokens[-1] == 151645 and messages[-1].finish_reason == common_pb2.FINISH_REASON_EOS
    assert tokenizer.decode(tokens[:-1]) == "Scripted reply."


async def test_many_concurrent_calls_all_complete(start_mocker):
    worker = await start_mocker("--speedup-ratio", "50")
    calls = [read_all(worker.stub.Generate(generate_request(range(i, i + 40), str(i), max_tokens=30)))
             for i in range(20)]
    results = await asyncio.wait_for(asyncio.gather(*calls), 20)
    assert all(sum(len(m.token_ids) for m in r) == 30 for r in results)


async def test_an_unservable_request_fails_with_invalid_argument(start_mocker):
    worker = await start_mocker("--speedup-ratio", "0")
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await read_all(worker.stub.Generate(generate_request(range(5000), max_tokens=4)))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    err = from_rpc_error(e.value)
    assert isinstance(err, InvalidRequest) and "context window" in err.message
