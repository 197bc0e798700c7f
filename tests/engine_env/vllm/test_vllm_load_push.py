"""The vLLM worker tells its publishers when its load moves, so that nothing polls an idle engine's load
(services/workers/vllm/engine.py): vLLM's stat logger on a changed step, each request's start and end.

Run in the vLLM environment, like the other tests here:
    .venv-vllm/bin/python -m pytest tests/engine_env/vllm -o addopts="--import-mode=importlib"
"""

from __future__ import annotations

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.v1.metrics.stats import SchedulerStats

from services.workers.vllm.engine import SchedulerLoad, VllmEngine


def test_a_step_that_changes_the_load_tells_the_listeners_and_an_unchanged_one_does_not():
    load = SchedulerLoad()
    told: list[int] = []
    load.listeners.append(lambda: told.append(1))
    logger = load.stat_logger_factory()(None, engine_index=0)
    logger.record(SchedulerStats(num_running_reqs=2, num_waiting_reqs=1, kv_cache_usage=0.25), None)
    assert len(told) == 1
    assert (load.of(0).running, load.of(0).waiting, load.of(0).kv_usage) == (2, 1, 0.25)
    logger.record(SchedulerStats(num_running_reqs=2, num_waiting_reqs=1, kv_cache_usage=0.25), None)
    logger.record(None, None)  # a step without scheduler stats
    assert len(told) == 1
    logger.record(SchedulerStats(num_running_reqs=2, num_waiting_reqs=0, num_skipped_waiting_reqs=1,
                                 kv_cache_usage=0.25), None)
    assert len(told) == 1  # skipped waiting ones count as waiting: the same load
    logger.record(SchedulerStats(num_running_reqs=3, kv_cache_usage=0.5), None)
    assert len(told) == 2 and load.of(0).running == 3


def test_a_requests_start_and_end_tell_the_listeners():
    engine = VllmEngine(AsyncEngineArgs(model="unused"))  # not started: the bookkeeping needs no engine
    idle_when_told: list[bool] = []
    engine.load.listeners.append(lambda: idle_when_told.append(engine.in_flight.idle(None)))
    with engine._in_flight(None):
        assert idle_when_told == [False]  # told once the request counts as running
    assert idle_when_told == [False, True]  # and again once it no longer does
