"""The soak report's arithmetic: growth after warm-up and the least-squares slope."""

from __future__ import annotations

import os

import pytest

from bench.soak import SoakConfig, SoakCounts, SoakResult, _slope, read_rss_kib

pytestmark = pytest.mark.unit


def test_slope_is_least_squares_per_second():
    assert _slope([(0, 0), (10, 10), (20, 20)]) == pytest.approx(1.0)
    assert _slope([(0, 5)]) == 0.0
    assert _slope([(0, 1), (10, 3), (20, 1)]) == pytest.approx(0.0)  # a bump is not a trend


def test_rows_measure_growth_from_the_first_sample_after_warmup():
    mib = 1024
    samples = [(0.0, {"a": 100 * mib, "b": 50 * mib}), (30.0, {"a": 200 * mib, "b": 50 * mib}),
               (60.0, {"a": 150 * mib, "b": 50 * mib}), (600.0, {"a": 160 * mib, "b": 50 * mib})]
    result = SoakResult(SoakConfig(warmup_minutes=1.0), 600.0, SoakCounts(), samples)
    rows = {r[0]: r[1:] for r in result.rows()}
    start, warm, end, growth, slope = rows["a"]
    assert (start, warm, end, growth) == (100, 150, 160, 10)
    assert slope == pytest.approx(10 / 540 * 600)
    assert rows["b"][3:] == (0, 0)


def test_reads_this_process_rss():
    assert read_rss_kib(os.getpid()) > 1000
    assert read_rss_kib(1 << 30) is None
