"""The mocker engine end to end on a fake clock: outputs, determinism, abort, cache hits, KV events."""

from __future__ import annotations

import asyncio

import pytest

from services.workers.engine import (
    EngineError,
    EngineRequest,
    FinishReason,
    GuidedDecoding,
    RequestRejected,
    SamplingParams,
)
from services.workers.mocker.config import MockerEngineConfig
from services.workers.mocker.engine import MockerEngine
from services.workers.mocker.outputs import OutputPolicy

pytestmark = pytest.mark.unit

EOS = (151645, 151643)


@pytest.fixture(scope="module")
def text_policy(tokenizer) -> OutputPolicy:
    return OutputPolicy.build(tokenizer)


@pytest.fixture
async def make_engine(clock, text_policy):
    engines = []

    def make(policy: OutputPolicy | None = None, listener=None, **cfg) -> MockerEngine:
        cfg.setdefault("speedup_ratio", 1.0)
        engine = MockerEngine(MockerEngineConfig(**cfg), policy or text_policy, eos_token_ids=EOS, clock=clock,
                              listener=listener)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        await engine.close()
        # Teardown invariant: nothing leaks once every stream is done.
        assert engine.cache.active_blocks == 0
        assert not engine.scheduler.has_work()


async def run(engine: MockerEngine, request: EngineRequest):
    outputs = [out async for out in engine.generate(request)]
    tokens = [t for out in outputs for t in out.token_ids]
    return outputs, tokens


def req(prompt, rid="r", **kw) -> EngineRequest:
    return EngineRequest(rid, list(prompt), **kw)


async def test_generates_exactly_max_tokens_with_usage_on_the_first_output(make_engine):
    engine = make_engine()
    outputs, tokens = await run(engine, req(range(40), max_tokens=17))
    assert len(tokens) == 17
    assert outputs[0].prompt_tokens == 40 and outputs[0].cached_tokens == 0
    assert all(o.prompt_tokens is None for o in outputs[1:])
    assert outputs[-1].finish_reason is FinishReason.LENGTH
    assert all(o.finish_reason is FinishReason.NONE for o in outputs[:-1])


async def test_without_max_tokens_it_fills_the_context(make_engine):
    engine = make_engine(context_length=64, speedup_ratio=0.0)
    _, tokens = await run(engine, req(range(50)))
    assert len(tokens) == 14


async def test_same_request_same_tokens_other_seed_other_tokens(make_engine):
    engine = make_engine(speedup_ratio=0.0)
    _, a = await run(engine, req(range(30), max_tokens=32, sampling=SamplingParams(seed=5)))
    _, b = await run(engine, req(range(30), max_tokens=32, sampling=SamplingParams(seed=5)))
    _, c = await run(engine, req(range(30), max_tokens=32, sampling=SamplingParams(seed=6)))
    assert a == b and a != c


async def test_concurrent_requests_interleave_and_stay_deterministic(make_engine):
    engine = make_engine(speedup_ratio=0.0)
    _, alone = await run(engine, req(range(100, 130), max_tokens=20))
    results = await asyncio.gather(*(run(engine, req(range(100 + i, 130 + i), rid=str(i), max_tokens=20))
                                     for i in range(8)))
    assert results[0][1] == alone
    assert all(len(tokens) == 20 for _, tokens in results)


async def test_a_repeated_prompt_reports_cached_tokens(make_engine):
    engine = make_engine()
    prompt = list(range(1000, 1050))
    first, _ = await run(engine, req(prompt, max_tokens=2))
    second, _ = await run(engine, req(prompt, max_tokens=2))
    assert first[0].cached_tokens == 0
    assert second[0].cached_tokens == 48  # three full blocks of 16


async def test_closing_the_stream_aborts_and_frees_blocks(make_engine):
    engine = make_engine()
    stream = engine.generate(req(range(100), max_tokens=1000))
    first = await anext(stream)
    assert first.token_ids
    assert engine.cache.active_blocks > 0 and len(engine.scheduler.running) == 1
    await stream.aclose()
    assert engine.cache.active_blocks == 0
    assert not engine.scheduler.has_work()


async def test_cancelling_the_consumer_task_frees_blocks(make_engine):
    engine = make_engine()
    got_first = asyncio.Event()

    async def consume():
        async for _ in engine.generate(req(range(100), max_tokens=1000)):
            got_first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(got_first.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert engine.cache.active_blocks == 0 and not engine.scheduler.has_work()


async def test_a_request_waiting_for_admission_can_be_aborted(make_engine):
    engine = make_engine(max_num_seqs=1)
    busy = engine.generate(req(range(20), rid="busy", max_tokens=1000))
    await anext(busy)
    queued = engine.generate(req(range(40, 60), rid="queued", max_tokens=5))
    pending = asyncio.create_task(anext(queued))
    await asyncio.sleep(0)
    assert len(engine.scheduler.waiting) == 1
    pending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pending
    assert not engine.scheduler.waiting
    await busy.aclose()


async def test_kv_events_store_on_prefill_and_remove_on_eviction(make_engine, listener):
    engine = make_engine(listener=listener, num_gpu_blocks=8, speedup_ratio=0.0)
    await run(engine, req(range(64), rid="a", max_tokens=1))  # 4 blocks stored
    stored = listener.of("stored")
    assert stored and sum(len(e[1]) for e in stored) == 4
    assert stored[0][2] is None
    a_blocks = stored[0][1]
    # Each request holds 4 full blocks plus a private tail block: b evicts one of a's blocks,
    # c the rest of a's (least recently used) and then b's last one.
    await run(engine, req(range(500, 564), rid="b", max_tokens=1))
    await run(engine, req(range(900, 964), rid="c", max_tokens=1))
    removed = [h for e in listener.of("removed") for h in e[1]]
    assert removed[:4] == a_blocks[::-1]  # suffix first
    assert removed[4] == listener.of("stored")[1][1][-1]


async def test_script_mode_answers_then_eos(make_engine, tokenizer):
    policy = OutputPolicy.build(tokenizer, output_text="Hello there, friend.")
    engine = make_engine(policy=policy, speedup_ratio=0.0)
    outputs, tokens = await run(engine, req(tokenizer.encode("hi").ids, max_tokens=50))
    assert tokens[-1] == EOS[0] and outputs[-1].finish_reason is FinishReason.EOS
    assert tokenizer.decode(tokens[:-1]) == "Hello there, friend."


async def test_request_eos_ids_override_the_models(make_engine, tokenizer):
    policy = OutputPolicy.build(tokenizer, output_text="Hi")
    engine = make_engine(policy=policy, speedup_ratio=0.0)
    _, tokens = await run(engine, req([1, 2, 3], max_tokens=50, eos_token_ids=(151643,)))
    assert tokens[-1] == 151643


async def test_logprobs_come_with_every_token_when_asked(make_engine):
    engine = make_engine(speedup_ratio=0.0)
    outputs, tokens = await run(engine, req(range(10), max_tokens=12, logprobs=3))
    logprobs = [lp for out in outputs for lp in out.logprobs]
    assert [lp.token_id for lp in logprobs] == tokens
    assert all(len(lp.top) == 3 and lp.top[0][0] == lp.token_id for lp in logprobs)
    plain, _ = await run(engine, req(range(10), max_tokens=2))
    assert all(out.logprobs is None for out in plain)


@pytest.mark.parametrize(("request_", "message"), [
    (req([], max_tokens=3), "empty"),
    (req(range(4096), max_tokens=3), "context window"),
    (req([1, 2], max_tokens=0), "at least 1"),
])
async def test_unservable_requests_are_rejected(make_engine, request_, message):
    engine = make_engine()
    with pytest.raises(RequestRejected, match=message):
        await run(engine, request_)


async def test_a_request_larger_than_the_cache_is_rejected(make_engine):
    engine = make_engine(num_gpu_blocks=4)
    with pytest.raises(RequestRejected, match="KV cache"):
        await run(engine, req(range(60), max_tokens=10))


async def test_close_fails_live_streams(make_engine):
    engine = make_engine()
    stream = engine.generate(req(range(10), max_tokens=1000))
    await anext(stream)
    await engine.close()
    with pytest.raises(EngineError):
        async for _ in stream:
            pass
    assert engine.cache.active_blocks == 0


async def test_guided_decoding_other_than_json_is_refused_not_ignored(make_engine):
    engine = make_engine()
    with pytest.raises(RequestRejected, match="not regex"):
        await run(engine, req(range(4), max_tokens=3, guided=GuidedDecoding(regex="a+")))
