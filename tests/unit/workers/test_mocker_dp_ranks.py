"""The mocker's --dp-size (services/workers/dp_engines.py): one engine, KV cache and KV event stream per rank
behind one worker, the request's rank choosing the engine."""

from __future__ import annotations

import inspect

import pytest

from services.workers import entry
from services.workers.config import ConfigError
from services.workers.dp_engines import RankedEngines
from services.workers.engine import EngineRequest, RequestRejected
from services.workers.mocker import main as mocker_main
from services.workers.mocker.config import parse_config

pytestmark = pytest.mark.unit


async def run(engine, request: EngineRequest) -> int:
    cached = 0
    async for out in engine.generate(request):
        if out.cached_tokens is not None:
            cached = out.cached_tokens
    return cached


async def test_each_rank_has_its_own_engine_cache_and_event_stream(demo_model_dir):
    cfg = parse_config(["--model-dir", str(demo_model_dir), "--port", "0", "--speedup-ratio", "0",
                        "--num-gpu-blocks", "64", "--dp-size", "2"], {})
    events = entry.KvEvents()
    serving = await mocker_main.build(cfg, events)
    try:
        card = serving.card
        assert (card.data_parallel_start_rank, card.data_parallel_size, card.total_kv_blocks) == (0, 2, 64)
        assert sorted(events.publishers) == [0, 1] and events.publisher is None
        prompt = list(range(40))
        engine = _engine_of(serving)
        assert sorted(engine.engines) == [0, 1]
        assert await run(engine, EngineRequest("a", prompt, max_tokens=1, dp_rank=1)) == 0
        assert await run(engine, EngineRequest("b", prompt, max_tokens=1, dp_rank=1)) == 32  # rank 1's cache
        assert await run(engine, EngineRequest("c", prompt, max_tokens=1, dp_rank=0)) == 0  # rank 0's is apart
        assert len(events.publishers[1].mirror) == 40 // 16 and events.publishers[1].dp_rank == 1
        with pytest.raises(RequestRejected) as e:
            await run(engine, EngineRequest("d", prompt, max_tokens=1, dp_rank=2))
        assert e.value.param == "dp_rank" and "its ranks: 0, 1" in str(e.value)
    finally:
        await serving.server.server.stop(0)  # bound, never started
        for close in serving.closers:
            await close()


def _engine_of(serving: entry.Serving) -> RankedEngines:
    """The RankedEngines the build handed the server (its close is among the closers)."""
    return next(c.__self__ for c in serving.closers if inspect.ismethod(c) and isinstance(c.__self__, RankedEngines))


async def test_a_request_without_a_rank_runs_on_the_least_busy_rank(demo_model_dir):
    cfg = parse_config(["--model-dir", str(demo_model_dir), "--port", "0", "--no-register", "--speedup-ratio", "0",
                        "--dp-size", "3"], {})
    events = entry.KvEvents()
    serving = await mocker_main.build(cfg, events)
    try:
        engine = _engine_of(serving)
        assert engine.engine_for(EngineRequest("x", [1, 2, 3])) is engine.engines[0]  # all idle: the lowest rank
        backlog = {0: 3, 1: 1, 2: 1}
        busier = RankedEngines(engine.engines, {r: (lambda n=n: n) for r, n in backlog.items()})
        assert busier.engine_for(EngineRequest("y", [1, 2, 3])) is engine.engines[1]
        assert busier.engine_for(EngineRequest("z", [1, 2, 3], dp_rank=0)) is engine.engines[0]  # a rank wins
        assert events.publishers == {}  # not registered: nobody routes by its caches
    finally:
        await serving.server.server.stop(0)
        for close in serving.closers:
            await close()


@pytest.mark.parametrize("flags, message", [
    (["--dp-size", "0"], "--dp-size must be positive"),
    (["--dp-size", "2", "--disaggregation-mode", "prefill"], "agg or decode only"),
    (["--worker-id", "a@b"], "may not contain '@'"),
])
def test_bad_dp_flags_are_refused(demo_model_dir, flags, message):
    with pytest.raises(ConfigError) as e:
        parse_config(["--model-dir", str(demo_model_dir), *flags], {})
    assert message in str(e.value)


def test_dynamos_spelling_and_env_twin(demo_model_dir):
    assert parse_config(["--model-dir", str(demo_model_dir), "--data-parallel-size", "4"], {}).dp_size == 4
    assert parse_config(["--model-dir", str(demo_model_dir)], {"MESHFRONT_MOCKER_DP_SIZE": "2"}).dp_size == 2
