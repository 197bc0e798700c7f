"""The garbage collector's pauses, timed per generation, and the start-up heap frozen out of its reach."""

from __future__ import annotations

import gc

import pytest
from prometheus_client import CollectorRegistry

from services.common.gc_pauses import PAUSE_BUCKETS, GcPauses, freeze_startup_heap

pytestmark = pytest.mark.unit


@pytest.fixture
def pauses():
    registry = CollectorRegistry()
    collector = GcPauses()
    registry.register(collector)
    yield registry
    collector.close()


def sample(registry: CollectorRegistry, suffix: str, **labels: str) -> float:
    found = registry.get_sample_value("meshfront_gc_pause_seconds" + suffix, labels)
    assert found is not None, (suffix, labels)
    return found


def test_each_collection_is_timed_under_its_generation(pauses):
    before = {g: sample(pauses, "_count", generation=g) for g in ("0", "1", "2")}
    gc.collect(2)
    gc.collect(2)
    gc.collect(0)
    assert sample(pauses, "_count", generation="2") - before["2"] == 2
    assert sample(pauses, "_count", generation="0") - before["0"] >= 1  # an automatic one may add to it
    assert sample(pauses, "_sum", generation="2") > 0


def test_buckets_are_cumulative_and_end_with_every_pause(pauses):
    gc.collect(2)
    counts = [sample(pauses, "_bucket", generation="2", le=str(bound)) for bound in PAUSE_BUCKETS]
    every = sample(pauses, "_bucket", generation="2", le="+Inf")
    assert counts == sorted(counts)
    assert every == sample(pauses, "_count", generation="2") >= 1


def test_a_closed_collector_stops_timing():
    collector = GcPauses()
    collector.close()
    assert collector._on_collection not in gc.callbacks


def test_start_up_heap_is_frozen_and_later_objects_are_not():
    early = [[]]
    try:
        frozen = freeze_startup_heap()
        later = [[]]
        assert frozen == gc.get_freeze_count() > 10_000  # this process's modules at least
        tracked = gc.get_objects()  # what collections walk
        assert not any(o is early for o in tracked)
        assert any(o is later for o in tracked)
    finally:
        gc.unfreeze()  # the test process's collections see everything again


def test_frozen_objects_are_exported(pauses):
    try:
        gc.freeze()
        # A frozen object whose last reference goes (another test's thread) leaves the count: bracket the read.
        before = gc.get_freeze_count()
        exported = pauses.get_sample_value("meshfront_gc_frozen_objects")
        assert exported is not None and before >= exported >= gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
