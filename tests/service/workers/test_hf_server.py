"""The hf worker (a tiny random Qwen2 on the CPU) behind a real gRPC server."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from meshfront.common.v1 import common_pb2
from meshfront.worker.v1 import worker_pb2, worker_pb2_grpc

from services.common.grpc_server import CHANNEL_OPTIONS
from services.models import default_test_model_dir
from services.workers.server import build_server
from tests.conftest import require_module

require_module("torch")
from services.workers.hf.config import parse_config  # noqa: E402
from services.workers.hf.main import build_engine  # noqa: E402

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
async def hf_worker():
    model_dir = default_test_model_dir(with_weights=True)
    cfg = parse_config(["--model-dir", str(model_dir), "--port", "0", "--no-register", "--reasoning-parser", "qwen3"],
                       env={})
    engine = build_engine(cfg)
    await engine.start()
    server = build_server(cfg.worker, engine)
    server.grace_s = 0
    await server.start()
    channel = grpc.aio.insecure_channel(server.address, options=CHANNEL_OPTIONS)
    yield worker_pb2_grpc.WorkerServiceStub(channel), engine
    await channel.close()
    await server.stop()
    await engine.close()


def request(prompt, *, max_tokens: int, temperature: float = 0.0, seed: int | None = None,
            logprobs: int | None = None) -> worker_pb2.GenerateRequest:
    return worker_pb2.GenerateRequest(request=common_pb2.PreprocessedRequest(
        request_id="hf", token_ids=list(prompt),
        sampling=common_pb2.SamplingOptions(temperature=temperature, seed=seed),
        stop=common_pb2.StopConditions(max_tokens=max_tokens, ignore_eos=True),
        output=common_pb2.OutputOptions(logprobs=logprobs)))


async def generate(stub, req) -> tuple[list[int], list[worker_pb2.GenerateResponse]]:
    messages = [m async for m in stub.Generate(req)]
    return [t for m in messages for t in m.token_ids], messages


async def test_greedy_decoding_is_deterministic_and_honours_max_tokens(hf_worker):
    stub, _ = hf_worker
    prompt = [9707, 1879, 11, 1246, 525, 498, 30]
    first, messages = await asyncio.wait_for(generate(stub, request(prompt, max_tokens=12)), 30)
    second, _ = await asyncio.wait_for(generate(stub, request(prompt, max_tokens=12)), 30)
    assert len(first) == 12 and first == second
    assert messages[0].prompt_tokens == len(prompt) and messages[0].cached_tokens == 0
    assert messages[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH


async def test_seeded_sampling_repeats_and_returns_logprobs(hf_worker):
    stub, _ = hf_worker
    req = request([100, 200, 300], max_tokens=6, temperature=1.0, seed=11, logprobs=2)
    a, messages = await asyncio.wait_for(generate(stub, req), 30)
    b, _ = await asyncio.wait_for(generate(stub, req), 30)
    assert a == b
    logprobs = [lp for m in messages for lp in m.logprobs]
    assert [lp.token_id for lp in logprobs] == a
    assert all(len(lp.top) == 2 and lp.logprob <= 0 for lp in logprobs)


async def test_cancelling_a_call_frees_the_model_for_the_next(hf_worker):
    stub, engine = hf_worker
    call = stub.Generate(request([1, 2, 3], max_tokens=3000))
    assert (await asyncio.wait_for(call.read(), 30)).token_ids
    call.cancel()
    deadline = asyncio.get_running_loop().time() + 5
    while engine.busy:
        assert asyncio.get_running_loop().time() < deadline, "the decode thread did not stop"
        await asyncio.sleep(0.01)
    tokens, _ = await asyncio.wait_for(generate(stub, request([4, 5], max_tokens=3)), 30)
    assert len(tokens) == 3


async def test_a_thinking_budget_closes_the_block_the_prompt_opened_once_spent(hf_worker):
    """The template opened <think> (Qwen3 with thinking on): after the budget's tokens, counting the prompt's
    newline inside the block, the next one is </think>; the answer goes on after it. A random model never
    writes </think> by itself in 12 greedy tokens (the request without a budget shows it)."""
    from services.workers.model_dir import load_tokenizer

    stub, engine = hf_worker
    tokenizer = load_tokenizer(engine.model_dir)
    prompt = tokenizer.encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n",
                              add_special_tokens=False).ids
    end = tokenizer.token_to_id("</think>")
    free, _ = await asyncio.wait_for(generate(stub, request(prompt, max_tokens=12)), 30)
    assert end not in free
    for budget in (5, 1):
        req = request(prompt, max_tokens=12)
        req.request.stop.max_thinking_tokens = budget
        tokens, messages = await asyncio.wait_for(generate(stub, req), 30)
        assert tokens.index(end) == budget - 1, tokens  # the prompt's "\n" after <think> is the first
        assert tokens[:budget - 1] == free[:budget - 1] and len(tokens) == 12
        assert messages[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
