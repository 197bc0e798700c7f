"""The router's Prometheus metrics: where requests went, and how right the KV predictions were.

Per request the router predicts how many prompt tokens the chosen worker already caches (overlap
blocks x block size; 0 outside kv mode); at the first token the gateway reports what the worker
actually served from cache (``usage.cached_tokens``). Counters of both give the predicted and the
actual hit rate over any window (``rate(predicted)/rate(prompt)``), and ``min(predicted, actual)``
gives precision and recall (also exported as gauges since start). KV event lag, gaps and resyncs come
from the ingest; per-worker request and prompt-token counters give each worker's load share.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from services.common.dp_ranks import split_target
from services.common.metrics import LATENCY_BUCKETS
from services.router.core.kv_ingest import KvEventIngest
from services.router.core.lifecycle import BOOK, FIRST_TOKEN, FREE, LifecycleEvent

_PREFIX = "meshfront_router"
_MAX_OPEN = 100_000  # predictions kept while waiting for their first token


@dataclasses.dataclass
class PredictionTotals:
    """Plain sums, also read by tests and the bench (no Prometheus parsing needed)."""

    requests: int = 0
    prompt_tokens: int = 0
    predicted_tokens: int = 0
    actual_tokens: int = 0
    true_positive_tokens: int = 0

    @property
    def actual_hit_rate(self) -> float:
        return self.actual_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def precision(self) -> float:
        return self.true_positive_tokens / self.predicted_tokens if self.predicted_tokens else 1.0

    @property
    def recall(self) -> float:
        return self.true_positive_tokens / self.actual_tokens if self.actual_tokens else 1.0


class RouterMetrics:
    """A ``LifecycleListener`` that records routing decisions and their outcomes."""

    def __init__(self, registry: CollectorRegistry | None = None, ingest: KvEventIngest | None = None,
                 policy_stats: dict[str, int] | None = None, queued: Callable[[], dict[str, int]] | None = None,
                 sessions: Callable[[], int] | None = None, disagg_decisions: dict[str, int] | None = None,
                 lora_decisions: dict[tuple[str, str], int] | None = None,
                 booked: Callable[[], dict[str, int]] | None = None):
        self.registry = registry or CollectorRegistry()
        self.totals = PredictionTotals()
        self._open: dict[str, tuple[int, str]] = {}  # request id -> (predicted cached tokens, target id)
        r = self.registry
        self.routed = Counter(f"{_PREFIX}_routed_requests", "Requests routed, by worker", ["worker"], registry=r)
        # KV hits per worker and data-parallel rank (services/common/dp_ranks.py; dp_rank "" for a worker without
        # ranks): what the router expected each to hold, and what it reported holding, at the first token.
        self.worker_predicted = Counter(f"{_PREFIX}_worker_predicted_cached_tokens", "Cached prompt tokens the "
                                        "router predicted, by worker and rank", ["worker", "dp_rank"], registry=r)
        self.worker_cached = Counter(f"{_PREFIX}_worker_cached_tokens", "Cached prompt tokens the worker reported, by "
                                     "worker and rank", ["worker", "dp_rank"], registry=r)
        self.routed_tokens = Counter(f"{_PREFIX}_routed_prompt_tokens", "Prompt tokens routed, by worker",
                                     ["worker"], registry=r)
        self.prompt = Counter(f"{_PREFIX}_reported_prompt_tokens", "Prompt tokens of requests with a reported "
                              "first token", registry=r)
        self.predicted = Counter(f"{_PREFIX}_predicted_cached_tokens", "Cached prompt tokens the router predicted",
                                 registry=r)
        self.actual = Counter(f"{_PREFIX}_actual_cached_tokens", "Cached prompt tokens the worker reported",
                              registry=r)
        self.true_positive = Counter(f"{_PREFIX}_correctly_predicted_cached_tokens",
                                     "min(predicted, actual) per request: precision and recall numerator",
                                     registry=r)
        self.error = Histogram(f"{_PREFIX}_prediction_error_tokens", "predicted - actual cached tokens per request",
                               buckets=(-1024, -256, -64, -16, -1, 0, 16, 64, 256, 1024), registry=r)
        self.route_duration = Histogram(f"{_PREFIX}_route_duration_seconds", "Route calls: arrival to the chosen "
                                        "worker, a wait for a busy model included", buckets=LATENCY_BUCKETS,
                                        registry=r)
        self.lag = Histogram(f"{_PREFIX}_kv_event_lag_seconds", "Publish-to-receive delay of KV event messages",
                             buckets=(0.001, 0.005, 0.02, 0.1, 0.5, 1, 5), registry=r)
        r.register(_LiveCollector(ingest, self, policy_stats, queued, sessions, disagg_decisions, lora_decisions,
                                  booked))

    def on_lifecycle(self, event: LifecycleEvent, remote: bool = False) -> None:
        """Counts our own decisions; keeps every replica's predictions, so that whichever replica
        receives the first-token report scores it (exactly once across replicas)."""
        if event.kind == BOOK:
            if not remote:
                self.routed.labels(event.worker_id).inc()
                self.routed_tokens.labels(event.worker_id).inc(event.prompt_tokens)
            if len(self._open) >= _MAX_OPEN:
                self._open.pop(next(iter(self._open)))
            self._open[event.request_id] = (event.overlap_tokens, event.worker_id)
        elif event.kind == FIRST_TOKEN:
            if remote:
                self._open.pop(event.request_id, None)
            else:
                self.observe_outcome(event)
        elif event.kind == FREE:
            self._open.pop(event.request_id, None)

    def observe_outcome(self, event: LifecycleEvent) -> None:
        opened = self._open.pop(event.request_id, None)
        if opened is None:
            return  # routed by another replica before this one started, or a duplicate report
        predicted, target = opened
        worker, rank = split_target(target)
        self.worker_predicted.labels(worker, "" if rank is None else str(rank)).inc(predicted)
        self.worker_cached.labels(worker, "" if rank is None else str(rank)).inc(event.cached_tokens)
        actual, prompt = event.cached_tokens, event.prompt_tokens
        t = self.totals
        t.requests += 1
        t.prompt_tokens += prompt
        t.predicted_tokens += predicted
        t.actual_tokens += actual
        t.true_positive_tokens += min(predicted, actual)
        self.prompt.inc(prompt)
        self.predicted.inc(predicted)
        self.actual.inc(actual)
        self.true_positive.inc(min(predicted, actual))
        self.error.observe(predicted - actual)

    def observe_lag(self, seconds: float) -> None:
        self.lag.observe(seconds)


class _LiveCollector:
    """Reads live counters at scrape time (no bookkeeping on the event path)."""

    def __init__(self, ingest: KvEventIngest | None, metrics: RouterMetrics, policy_stats: dict[str, int] | None,
                 queued: Callable[[], dict[str, int]] | None = None, sessions: Callable[[], int] | None = None,
                 disagg_decisions: dict[str, int] | None = None,
                 lora_decisions: dict[tuple[str, str], int] | None = None,
                 booked: Callable[[], dict[str, int]] | None = None):
        self._ingest = ingest
        self._booked = booked
        self._lora_decisions = lora_decisions
        self._disagg_decisions = disagg_decisions
        self._metrics = metrics
        self._policy_stats = policy_stats
        self._queued = queued
        self._sessions = sessions

    def collect(self):
        yield self._load_share()
        # Since start, over requests with a reported first token; a window's figures come from the counters:
        # rate(correctly_predicted) / rate(predicted_cached) and / rate(actual_cached).
        t = self._metrics.totals
        yield GaugeMetricFamily(f"{_PREFIX}_prediction_precision", "Of the cached tokens the router predicted, the "
                                "share the workers reported cached (1 when none were predicted)", value=t.precision)
        yield GaugeMetricFamily(f"{_PREFIX}_prediction_recall", "Of the cached tokens the workers reported, the "
                                "share the router predicted (1 when none were cached)", value=t.recall)
        queued = GaugeMetricFamily(f"{_PREFIX}_queued_requests", "Requests waiting for a busy model "
                                   "(--queue-timeout-s), per model", labels=["model"])
        for model, n in (self._queued() if self._queued else {}).items():
            queued.add_metric([model], n)
        yield queued
        yield GaugeMetricFamily(f"{_PREFIX}_sessions", "Sticky sessions this replica remembers",
                                value=self._sessions() if self._sessions else 0)
        booked = GaugeMetricFamily(f"{_PREFIX}_booked_requests", "Requests booked per worker as this replica holds "
                                   "them: its own, and the ones other replicas shared", labels=["worker"])
        for worker, n in (self._booked() if self._booked else {}).items():
            booked.add_metric([worker], n)
        yield booked
        decisions = CounterMetricFamily(f"{_PREFIX}_disagg_decisions", "Requests this replica routed, by why they "
                                        "were split into a prefill and a decode leg or kept aggregated (disagg.py)",
                                        labels=["reason"])
        for reason, n in (self._disagg_decisions or {}).items():
            decisions.add_metric([reason], n)
        yield decisions
        lora = CounterMetricFamily(f"{_PREFIX}_lora_requests", "Requests for a LoRA adapter this replica routed, by "
                                   "adapter and placement: held (a worker holding it) or runtime_load (a worker "
                                   "that loads it for this request; lora.py)", labels=["adapter", "placement"])
        for (adapter, placement), n in (self._lora_decisions or {}).items():
            lora.add_metric([adapter, placement], n)
        yield lora
        for name, value in (self._policy_stats or {}).items():
            yield CounterMetricFamily(f"{_PREFIX}_kv_{name}", f"kv policy {name} (see policies/kv_aware.py)",
                                      value=value)
        if self._ingest is not None:
            yield from self._kv_index(self._ingest)

    @staticmethod
    def _kv_index(ingest: KvEventIngest):
        s = ingest.stats
        for name, value, doc in (("kv_event_messages", s.messages, "KV event messages received"),
                                 ("kv_events", s.events, "KV events applied"),
                                 ("kv_event_gaps", s.gaps, "Sequence gaps detected in workers' KV events"),
                                 ("kv_unknown_parents", s.unknown_parents, "Stores whose parent block was unknown"),
                                 ("kv_resyncs", s.resyncs, "Full block-set fetches requested"),
                                 ("kv_dumps_loaded", s.dumps_loaded, "Full block sets loaded")):
            yield CounterMetricFamily(f"{_PREFIX}_{name}", doc, value=value)
        index = ingest.index
        blocks = GaugeMetricFamily(f"{_PREFIX}_kv_index_blocks", "Blocks the index knows per worker", labels=["worker"])
        for w in index.workers():
            blocks.add_metric([w], index.worker_blocks(w))
        yield blocks
        yield GaugeMetricFamily(f"{_PREFIX}_kv_index_nodes", "Radix index nodes", value=index.node_count)

    def _load_share(self):
        share = GaugeMetricFamily(f"{_PREFIX}_worker_load_share", "Share of routed prompt tokens per worker",
                                  labels=["worker"])
        counts = {s.labels["worker"]: s.value for m in self._metrics.routed_tokens.collect() for s in m.samples
                  if s.name.endswith("_total")}
        total = sum(counts.values()) or 1.0
        for w, v in counts.items():
            share.add_metric([w], v / total)
        return share
