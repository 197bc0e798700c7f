"""The edge's /metrics body: every gateway replica's frontend families in one exposition.

Each replica sends a ``snapshot`` of its frontend registry; ``render`` puts every family's samples
from all replicas under one HELP/TYPE header, each sample labelled ``gateway="<replica>"``. Series
stay per replica rather than summed: a sum would drop whenever a replica stops or restarts, which a
scraper takes for a counter reset and turns into a false spike; per-replica series are true
counters for as long as their replica lives, and ``sum by (model)`` gives the frontend's totals.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

REPLICA_LABEL = "gateway"
# [name, type, help, [[sample name, labels, value], ...]] per family
Snapshot = dict[str, Any]


def snapshot(registry: CollectorRegistry, replica: str) -> Snapshot:
    """One replica's families as plain JSON-ready data."""
    families = [[m.name, m.type, m.documentation, [[s.name, s.labels, s.value] for s in m.samples]]
                for m in registry.collect()]
    return {"replica": replica, "families": families}


class _Merged(Collector):
    def __init__(self, snapshots: Iterable[Snapshot]):
        self._families: dict[str, Metric] = {}
        for snap in sorted(snapshots, key=lambda s: s["replica"]):
            for name, kind, help_text, samples in snap["families"]:
                family = self._families.get(name)
                if family is None:
                    family = self._families[name] = Metric(name, help_text, kind)
                for sample_name, labels, value in samples:
                    family.add_sample(sample_name, {**labels, REPLICA_LABEL: snap["replica"]}, value)

    def collect(self) -> Iterable[Metric]:
        return list(self._families.values())


def render(snapshots: Iterable[Snapshot]) -> bytes:
    """Prometheus text format 0.0.4."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(snapshots))
    return generate_latest(registry)
