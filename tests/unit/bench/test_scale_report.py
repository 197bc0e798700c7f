"""bench/scale_report.py: naming the bottleneck of a row, scaling against one replica, the goals."""

from __future__ import annotations

import dataclasses

import pytest

from bench import cli
from bench.scale_hosts import Throttling
from bench.scale_report import (
    ScaleRow,
    Verdict,
    against_one,
    bottleneck,
    goal_lines,
    markdown_table,
    medians,
    mux_cell,
    mux_per_request,
    process_group,
)

pytestmark = pytest.mark.unit


def test_replicas_fold_into_their_stage():
    assert process_group("gateway-3") == "gateway"
    assert process_group("postprocessor-0") == "postprocessor"
    assert process_group("mocker-1") == "workers"
    assert process_group("envoy") == "envoy"


def test_the_stage_is_the_bottleneck_at_its_quota_and_throttled():
    # Two replicas of 0.1 core for 10 s: 2000 ms of capacity, 1900 used, throttled in half the periods.
    v = bottleneck("gateway", 10.0, 0.1, 1900.0, [Throttling(500, 250, 900.0), Throttling(500, 260, 950.0)],
                   {"postprocessor-0": 1500.0, "envoy": 800.0}, machine_busy_cores=1.2, cores=2)
    assert v.bottleneck == "gateway"
    assert "95% of its quota" in v.evidence and "postprocessor-0 0.15 cores" in v.evidence


def test_a_stage_below_its_quota_is_not_the_bottleneck_even_when_throttled_now_and_then():
    # Bursts get throttled, but 40 % of the quota used means something else held the row back.
    v = bottleneck("router", 10.0, 0.05, 200.0, [Throttling(500, 300, 100.0)], {"gateway-0": 9000.0},
                   machine_busy_cores=1.5, cores=2)
    assert v.bottleneck == "gateway-0"  # 0.9 cores: a single-threaded process at its ceiling


def test_a_full_machine_is_named_when_no_process_is_at_a_core():
    v = bottleneck("preprocessor", 10.0, 0.05, 100.0, [Throttling(500, 0, 0.0)], {"gateway-0": 5000.0},
                   machine_busy_cores=1.95, cores=2)
    assert v.bottleneck == "machine"


def test_nothing_saturated_is_the_offered_load():
    v = bottleneck("preprocessor", 10.0, 0.05, 100.0, [Throttling(0, 0, 0.0)], {}, machine_busy_cores=0.5, cores=2)
    assert v.bottleneck == "none (offered load)" and "throttled in 0% of periods" in v.evidence


def _row(replicas: int, req_per_s: float, stage_ms: float, bottleneck_name: str = "gateway", stage: str = "gateway",
         cached: float | None = None, label: str = "") -> ScaleRow:
    return ScaleRow(stage=stage, replicas=replicas, quota_cores=0.1, ok=300, errors=0, req_per_s=req_per_s,
                    stage_cpu_ms=stage_ms, total_cpu_ms=3 * stage_ms, ttft_p50_ms=100.0, ttft_p99_ms=300.0,
                    verdict=Verdict(bottleneck_name, ""), bg_cores=0.0, cached_share=cached, label=label)


def test_scaling_is_per_replica_against_the_one_replica_row_of_the_same_case():
    rows = [_row(1, 20.0, 5.0), _row(2, 38.0, 5.2), _row(4, 64.0, 6.0),
            _row(1, 50.0, 2.0, stage="router", bottleneck_name="router")]
    ratios = against_one(rows)
    assert ratios[1] == pytest.approx((0.95, 0.04))
    assert ratios[2] == pytest.approx((0.80, 0.20))
    assert ratios[3] == pytest.approx((1.0, 0.0))  # the router's own one-replica row, not the gateway's


def test_goals_are_judged_only_while_the_stage_is_the_bottleneck():
    rows = [_row(1, 20.0, 5.0), _row(2, 38.0, 5.2), _row(4, 64.0, 6.0), _row(4, 80.0, 5.0, bottleneck_name="envoy")]
    lines = goal_lines(rows)
    assert lines[0] == "gateway x2: 0.95x linear, gateway CPU per request +4%: met"
    assert lines[1].endswith("0.80x linear, gateway CPU per request +20%: NOT met")
    assert "not judged: bottleneck envoy / gateway at 1 replica" in lines[2]


def test_router_replicas_compare_cached_share_in_points():
    rows = [_row(1, 30.0, 1.0, "router", "router", cached=0.612, label="router-kv"),
            _row(3, 80.0, 1.1, "router", "router", cached=0.571, label="router-kv")]
    (line,) = goal_lines(rows)
    assert line == "router-kv x3: cached share 57.1 % against 61.2 % with one router (-4.1 points): NOT met"
    assert "| router-kv | 3 | 0.1 | 80.0 | 26.7 | 0.89 |" in markdown_table(rows)


def test_mux_traffic_is_messages_per_request_and_chunks_per_message_over_the_window():
    before = {"worker.GenerateStream": (1000.0, 8000.0), "postprocessor.GenerateStream": (500.0, 2000.0)}
    after = {"worker.GenerateStream": (3000.0, 24000.0), "postprocessor.GenerateStream": (500.0, 2000.0)}
    # 2000 messages carrying 16000 chunks for 100 requests; the postprocessor's hop sent nothing: no figure.
    assert mux_per_request(before, after, 100) == {"worker.GenerateStream": (20.0, 8.0)}
    assert mux_per_request({}, after, 0) == {}  # no request completed: no division by 0
    both = mux_per_request({}, {"postprocessor.GenerateStream": (330.0, 2640.0), "worker.GenerateStream": (350.0,
                                                                                                          2450.0)}, 10)
    assert mux_cell(both) == "worker→post 35.0 (7.0), post→gw 33.0 (8.0)"  # in the order a token travels
    assert mux_cell({}) == "—"


def test_rounds_fold_into_their_medians_and_the_goals_are_judged_on_them():
    rounds = [(1, 10.0, 2.0, 40.0, 2.2), (2, 7.0, 2.6, 30.0, 2.6), (3, 8.0, 2.4, 31.0, 2.5)]
    rows = []
    for n, one_rps, one_ms, four_rps, four_ms in rounds:
        rows += [dataclasses.replace(_row(1, one_rps, one_ms, "router", "router"), round=n),
                 dataclasses.replace(_row(4, four_rps, four_ms, "router" if n != 2 else "machine", "router"), round=n)]
    one, four = medians(rows)
    assert (one.replicas, one.req_per_s, one.stage_cpu_ms, one.ok, one.round) == (1, 8.0, 2.4, 900, 0)
    assert (four.req_per_s, four.stage_cpu_ms) == (31.0, 2.5)
    assert four.verdict == Verdict("router", "the bottleneck in 2 of 3 rounds")
    # Round 1 alone reads 1.0x linear; its medians read 31 / (4 x 8) = 0.97x and +4 %: met.
    assert goal_lines([one, four]) == ["router x4: 0.97x linear, router CPU per request +4%: met"]


def test_the_cli_takes_rounds():
    assert cli.parse_args(["scale", "--rounds", "3"]).rounds == 3
