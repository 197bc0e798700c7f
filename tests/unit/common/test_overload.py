"""Busy thresholds: which workers are available, and the error when none is."""

from __future__ import annotations

import pytest

from services.common.errors import Overloaded
from services.common.overload import BusyThreshold

pytestmark = pytest.mark.unit


def test_disabled_threshold_keeps_every_worker():
    assert BusyThreshold(0).available([("a", 10**6)], lambda w: w[1], "m") == [("a", 10**6)]


def test_busy_workers_are_dropped_and_an_all_busy_fleet_is_overloaded():
    busy = BusyThreshold(4)
    workers = [("a", 4), ("b", 3), ("c", 9)]
    assert busy.available(workers, lambda w: w[1], "m") == [("b", 3)]
    with pytest.raises(Overloaded) as info:
        busy.available([("a", 4), ("c", 5)], lambda w: w[1], "m")
    assert info.value.http_status == 503 and "`m`" in info.value.message
