"""bench/edge_floor.py: the floor's pre-rendered stream reads as a real one, its ticker paces every stream
together, and the ratios each shape is printed with."""

from __future__ import annotations

import asyncio

import pytest

from bench.edge_floor import Ticker, front_ms, ratio_spread, ratios, render_chunks, step_ms
from bench.loadgen import RequestResult, SseParser

pytestmark = pytest.mark.unit


def test_the_pre_rendered_stream_is_what_the_load_generator_counts():
    result = RequestResult(start=0.0)
    parser = SseParser(result)
    for i, frame in enumerate(render_chunks("meshfront/demo-qwen", 64, prompt_tokens=208)):
        parser.feed(float(i), frame)
    assert result.done and not result.error
    assert result.content_events == 64 and result.completion_tokens == 64 and result.prompt_tokens == 208


def test_pace_follows_the_mocker_speedup():
    assert step_ms(1.0) == 10.0
    assert step_ms(100.0) == pytest.approx(0.1)
    assert step_ms(0.0) == 0.0  # instant: no ticker at all


def test_every_waiting_stream_is_released_by_the_same_tick_and_the_ticker_stops_when_idle():
    async def scenario() -> tuple[list[float], bool]:
        ticker = Ticker(0.02)
        loop = asyncio.get_running_loop()
        released: list[float] = []

        async def stream() -> None:
            await ticker.wait()
            released.append(loop.time())

        await asyncio.gather(*(stream() for _ in range(5)))
        await asyncio.sleep(0.06)
        return released, ticker._task is not None and ticker._task.done()

    released, stopped = asyncio.run(scenario())
    assert len(released) == 5 and max(released) - min(released) < 0.005
    assert stopped


def test_each_shape_is_a_ratio_to_the_floor_at_the_same_concurrency():
    rows = [("edge", 128, {"envoy": 1.0, "gateway": 2.0, "total": 3.0}),
            ("inproc", 128, {"envoy": 1.2, "gateway": 2.7, "workers": 1.5, "total": 5.4}),
            ("split", 128, {"total": 7.5, "workers": 1.4, "nats": 0.1}),
            ("split", 32, {"total": 9.0})]  # no floor at c=32: no ratio
    lines = ratios(rows)
    assert lines == ["inproc c=128: 1.80x the floor's CPU per request in total, 1.30x in the front (without workers "
                     "and NATS)",
                     "split c=128: 2.50x the floor's CPU per request in total, 2.00x in the front (without workers "
                     "and NATS)"]
    assert front_ms({"total": 7.5, "workers": 1.4, "nats": 0.1}) == pytest.approx(6.0)


def test_rounds_are_each_against_their_own_floor_and_summed_up_by_the_median():
    rounds = [[("edge", 128, {"total": 4.0}), ("split", 128, {"total": 8.0, "workers": 2.0})],
              [("edge", 128, {"total": 5.0}), ("split", 128, {"total": 8.0, "workers": 2.0})],
              [("split", 128, {"total": 9.0, "workers": 1.0}), ("edge", 128, {"total": 4.0})]]
    # fronts 6/4, 6/5, 8/4 = 1.50, 1.20, 2.00; totals 2.00, 1.60, 2.25
    assert ratio_spread(rounds) == ["split c=128 over 3 rounds: the front 1.50x the floor (median; 1.20-2.00), "
                                    "in total 2.00x (1.60-2.25)"]
    assert ratio_spread([[("split", 128, {"total": 8.0})]]) == []  # no floor in the round: no ratio


def test_mesh_rounds_flag():
    from bench import cli

    assert cli.parse_args(["mesh", "--shape", "edge,split", "--rounds", "3"]).rounds == 3
    assert cli.parse_args(["mesh"]).rounds == 1
    with pytest.raises(SystemExit):
        cli.parse_args(["mesh", "--rounds", "0"])
