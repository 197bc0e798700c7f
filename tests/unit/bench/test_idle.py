"""bench/idle.py's per-thread accounting: cores and wake-ups per thread name over a window."""

from __future__ import annotations

import os

import pytest

from bench.idle import ThreadCounters, idle_between, read_threads, report

pytestmark = pytest.mark.unit


def test_threads_of_one_name_add_up_and_a_thread_born_in_the_window_counts_from_zero():
    before = {"1:python": ThreadCounters(1_000_000_000, 10), "2:event_engine": ThreadCounters(0, 5)}
    after = {"1:python": ThreadCounters(1_020_000_000, 30), "2:event_engine": ThreadCounters(10_000_000, 45),
             "3:event_engine": ThreadCounters(10_000_000, 20)}
    r = idle_between("gateway-0", before, after, seconds=10.0)
    assert r.by_thread == {"python": pytest.approx((0.002, 2.0)), "event_engine": pytest.approx((0.002, 6.0))}
    assert r.cores == pytest.approx(0.004) and r.wakeups_per_s == pytest.approx(8.0)


def test_the_tier_leaves_the_workers_out_and_this_process_reads_as_threads():
    rows = [idle_between("router", {}, {"1:python": ThreadCounters(10_000_000, 1)}, 1.0),
            idle_between("mocker-0", {}, {"1:python": ThreadCounters(500_000_000, 1)}, 1.0)]
    text, tier = report("split", rows)
    assert tier == pytest.approx(0.01) and "mocker-0" in text
    mine = read_threads(os.getpid())
    assert mine and all(c.cpu_ns >= 0 and c.wakeups >= 0 for c in mine.values())
