"""The cyclic garbage collector's pauses: kept short once a process serves, and measured.

A collection stops the whole process, its event loop included, so every stream the process carries
waits for it. How long a full (generation 2) collection takes grows with every object the process
holds, and most of those are what start-up made and never frees: imported modules, protobuf
descriptors, the service's tables. Measured in the all-in-one gateway under bench/disagg.py's load, a
full collection paused every stream for 72-93 ms, about once in 15 s, and a third of the gateway's
inter-token gaps over 14 ms overlapped a collection of some generation (bench/RESULTS.md).

``freeze_startup_heap`` moves everything alive when the server starts listening to the collector's
permanent generation (``gc.freeze``), which collections never traverse again; reference counting still
frees those objects as usual, only a reference cycle among them would outlive its last use. vLLM's
engine does the same after it starts. A full collection then walks only what serving created: 10 ms
in the same run.

``GcPauses`` exports each collection's pause as ``meshfront_gc_pause_seconds{generation}``, so an
operator can tell a collector's stall from the network's in an ITL spike. Its ``gc.callbacks`` hook
touches only plain integers: a metric's lock, taken by a collection that interrupted another holder of
the same lock on this thread, would deadlock.
"""

from __future__ import annotations

import bisect
import functools
import gc
import itertools
import logging
import time
from collections.abc import Iterator

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

PAUSE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
GENERATIONS = 3


def freeze_startup_heap() -> int:
    """Collects what start-up left as garbage, then puts every live object out of later collections' reach;
    returns how many objects the permanent generation now holds."""
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("%d start-up objects frozen out of garbage collection in %.0f ms", frozen,
             (time.perf_counter() - started) * 1000)
    return frozen


class GcPauses(Collector):
    """Times every collection of this process (a ``gc.callbacks`` hook) and exports the pauses per generation,
    with the number of frozen objects."""

    def __init__(self) -> None:
        # Per generation: the count of pauses up to each bucket's bound (the last slot: above every bound).
        self._buckets = [[0] * (len(PAUSE_BUCKETS) + 1) for _ in range(GENERATIONS)]
        self._sums = [0.0] * GENERATIONS
        self._started = 0.0
        gc.callbacks.append(self._on_collection)

    def close(self) -> None:
        gc.callbacks.remove(self._on_collection)

    def _on_collection(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        pause = time.perf_counter() - self._started
        generation = info["generation"]
        self._buckets[generation][bisect.bisect_left(PAUSE_BUCKETS, pause)] += 1
        self._sums[generation] += pause

    def collect(self) -> Iterator[GaugeMetricFamily | HistogramMetricFamily]:
        pauses = HistogramMetricFamily("meshfront_gc_pause_seconds",
                                       "How long each garbage collection stopped this process, per generation",
                                       labels=["generation"])
        bounds = (*map(str, PAUSE_BUCKETS), "+Inf")
        for generation in range(GENERATIONS):
            cumulative = list(zip(bounds, itertools.accumulate(self._buckets[generation]), strict=True))
            pauses.add_metric([str(generation)], cumulative, self._sums[generation])
        yield pauses
        yield GaugeMetricFamily("meshfront_gc_frozen_objects",
                                "Objects start-up left alive, out of reach of garbage collection (gc.freeze)",
                                value=gc.get_freeze_count())


@functools.cache
def gc_pauses(registry: CollectorRegistry = REGISTRY) -> GcPauses:
    """The process's one ``GcPauses``, registered in ``registry`` on first use."""
    collector = GcPauses()
    registry.register(collector)
    return collector
