"""The timing model, and the engine's pacing on a fake clock (no real sleeping)."""

from __future__ import annotations

import itertools

import pytest

from services.workers.engine import EngineRequest
from services.workers.mocker.config import MockerEngineConfig
from services.workers.mocker.engine import MockerEngine
from services.workers.mocker.outputs import OutputPolicy
from services.workers.mocker.scheduler import StepOutcome
from services.workers.mocker.timing import TimingModel
from tests.unit.workers.conftest import FakeClock

pytestmark = pytest.mark.unit


def test_prefill_grows_with_uncached_tokens():
    t = TimingModel()
    assert t.prefill_ms(0) == 0
    assert t.prefill_ms(1000) == pytest.approx(26.2 + 74.1 + 1.25)
    assert t.prefill_ms(8000) > 7 * t.prefill_ms(1000) - 7 * 26.2


def test_decode_grows_mildly_with_kv_usage():
    t = TimingModel(total_blocks=1000)
    empty, half, full = t.decode_ms(0), t.decode_ms(500), t.decode_ms(1000)
    assert empty == pytest.approx(5.74)
    assert empty < half < full == pytest.approx(5.74 + 54.01 - 25.74)
    assert t.decode_ms(5000) == full  # clamped


def test_step_time_adds_prefill_and_decode_and_divides_by_speedup():
    mixed = StepOutcome(prefill_tokens=100, decode_tokens=3, active_blocks=0)
    one = TimingModel(speedup_ratio=1.0).step_seconds(mixed)
    assert one == pytest.approx((26.2 + 7.41 + 1.25e-2 + 5.74) / 1000)
    assert TimingModel(speedup_ratio=4.0).step_seconds(mixed) == pytest.approx(one / 4)
    assert TimingModel(speedup_ratio=0.0).step_seconds(mixed) == 0
    assert TimingModel().step_seconds(StepOutcome()) == 0


async def collect(engine: MockerEngine, request: EngineRequest, clock) -> list[tuple[float, int]]:
    """(simulated time, tokens) for each output."""
    arrivals = []
    async for out in engine.generate(request):
        arrivals.append((clock.now(), len(out.token_ids)))
    return arrivals


@pytest.mark.parametrize("speedup", [1.0, 10.0])
async def test_engine_paces_tokens_by_the_timing_model(clock, speedup):
    cfg = MockerEngineConfig(num_gpu_blocks=1000, speedup_ratio=speedup)
    engine = MockerEngine(cfg, OutputPolicy(list(range(1000, 2000))), clock=clock)
    try:
        start = clock.now()
        arrivals = await collect(engine, EngineRequest("r", list(range(64)), max_tokens=5), clock)
    finally:
        await engine.close()
    t = engine.timing
    # One output per step: the consumer is always waiting when a step delivers.
    assert [n for _, n in arrivals] == [1] * 5
    ttft = arrivals[0][0] - start
    assert ttft == pytest.approx(t.prefill_ms(64) / 1000 / speedup)
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(arrivals)]
    # 64 prompt tokens plus up to 4 generated ones occupy 5 blocks.
    assert gaps == pytest.approx([t.decode_ms(5) / 1000 / speedup] * 4)


class BusyClock(FakeClock):
    """A fake clock on which every reading costs ``cost`` seconds: the mocker's own CPU work between steps."""

    def __init__(self, cost: float) -> None:
        super().__init__()
        self.cost = cost

    def now(self) -> float:
        self.t += self.cost
        return self.t


@pytest.mark.parametrize("cost_ms", [0.0, 0.5, 3.0, 20.0])
async def test_the_mockers_own_work_runs_inside_the_modelled_step_unless_it_overruns_it(cost_ms):
    cost = cost_ms / 1000
    clock = BusyClock(cost)
    engine = MockerEngine(MockerEngineConfig(num_gpu_blocks=1000), OutputPolicy(list(range(1000, 2000))), clock=clock)
    try:
        arrivals = await collect(engine, EngineRequest("r", list(range(64)), max_tokens=8), clock)
    finally:
        await engine.close()
    step = engine.timing.decode_ms(5) / 1000  # ~6 ms: the model's decode step at this KV use
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(arrivals)]
    if cost < step:
        # One step as modelled, give or take the consumer's own reading of the clock; before, every step
        # lasted the model's time plus the mocker's work (here several readings).
        assert all(step - cost - 1e-9 <= g <= step + cost + 1e-9 for g in gaps), gaps
    else:  # work longer than the step lengthens it
        assert min(gaps) > step


async def test_speedup_zero_never_sleeps_and_coalesces(clock):
    cfg = MockerEngineConfig(speedup_ratio=0.0)
    engine = MockerEngine(cfg, OutputPolicy(list(range(1000, 2000))), clock=clock)
    try:
        arrivals = await collect(engine, EngineRequest("r", [1, 2, 3], max_tokens=200), clock)
    finally:
        await engine.close()
    assert clock.sleeps == []
    assert sum(n for _, n in arrivals) == 200
    assert len(arrivals) < 20  # the loop runs many steps before it lets the consumer in


def test_the_step_time_coefficients_are_flags_whose_defaults_leave_the_model_unchanged(demo_model_dir):
    from services.workers.config import ConfigError
    from services.workers.mocker.config import parse_config

    default = parse_config(["--model-dir", str(demo_model_dir)], env={}).engine
    assert default.timing() == TimingModel(total_blocks=default.num_gpu_blocks)
    # Dynamo 1.6.1's prefill polynomial (bench/disagg.py runs both mockers on it): 6000 tokens in ~123 ms, not ~516.
    dynamo = parse_config(["--model-dir", str(demo_model_dir), "--prefill-ms-const", "16.50142",
                           "--prefill-ms-per-token", "1.518344e-2", "--prefill-ms-per-token-sq", "4.209989e-7",
                           "--speedup-ratio", "2"], env={"MESHFRONT_MOCKER_DECODE_MS_CONST": "3"}).engine
    engine = MockerEngine(dynamo, OutputPolicy([1]))
    assert engine.timing.prefill_ms(6000) == pytest.approx(16.50142 + 91.10064 + 15.1559604)
    assert default.timing().prefill_ms(6000) == pytest.approx(26.2 + 444.6 + 45.0)
    assert engine.timing.decode_ms(0) == 3.0 and engine.timing.speedup_ratio == 2.0
    with pytest.raises(ConfigError, match="prefill-ms-per-token-sq must be >= 0"):
        parse_config(["--model-dir", str(demo_model_dir), "--prefill-ms-per-token", "-1"], env={})
    with pytest.raises(ConfigError, match="decode step must take > 0 ms"):
        parse_config(["--model-dir", str(demo_model_dir), "--decode-ms-const", "1", "--decode-ms-lin", "-10"], env={})
