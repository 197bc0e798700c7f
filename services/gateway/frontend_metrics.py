"""The frontend's request metrics, in Meshfront's naming or Dynamo's, chosen by ``--metrics-prefix``.

The gateway records each request once (``RequestTracker`` in request_metrics.py hands a finished
request's ``Outcome`` to the process's ``Recorder``). Two recorders name the same observations:

- ``meshfront_gateway`` (the default): our families, documented in docs/metrics.md ("Gateway").
- any other prefix, e.g. ``dynamo_frontend``: Dynamo's frontend families with Dynamo's labels and
  label values (``requests_total{model, endpoint="chat_completions", request_type="stream",
  status="success", error_type=""}``, sequence-length histograms, log-spaced buckets), so dashboards
  built for Dynamo work unchanged; docs/metrics.md ("Dynamo naming") lists them.

Dynamo's naming also has Dynamo's mesh-wide families: per-worker gauges, model configuration, migrations
and the router's queue, read when scraped from discovery's cards and the gateway's view of its own
requests (worker_metrics.py), so they cost nothing between scrapes; docs/metrics.md says where each
comes from.

Each recorder's families live in their own registry: the gateway's ``--metrics-port`` serves them
beside everything else (the registry is registered into prometheus-client's global one), and the
edge's ``/metrics`` (services/gateway/edge/) serves exactly them, for every replica.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Protocol

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from services.common.discovery import PREFILL, WorkerCard
from services.common.dp_ranks import target_id
from services.common.metrics import ITL_BUCKETS, LATENCY_BUCKETS
from services.gateway.worker_metrics import WorkerView, worker_view

DEFAULT_PREFIX = "meshfront_gateway"
DYNAMO_PREFIX = "dynamo_frontend"
_PREFIX = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# Sequence lengths in tokens, for our histograms: 1 to 128k in powers of four.
TOKEN_BUCKETS = tuple(4.0**i for i in range(9))


def check_prefix(prefix: str) -> str:
    if not _PREFIX.fullmatch(prefix):
        raise ValueError(f"--metrics-prefix {prefix!r} is not a Prometheus name prefix ([a-zA-Z_][a-zA-Z0-9_]*)")
    return prefix


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One request, as it ended."""

    model: str  # "" when the body was refused before its model was known
    endpoint: str  # chat, completions, ... (the tracker's name)
    stream: bool
    status: str  # the HTTP status the client got; "499": it went away; a stream that failed mid-way is "200"
    reason: str  # "" on success, else the MeshError reason (INVALID_REQUEST, OVERLOADED, CANCELLED, ...)
    started: bool  # it was valid and ran (counted in flight)
    duration_s: float
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    itl_s: float | None = None  # mean gap between output tokens of a stream with more than one
    first_token: bool = False  # its first token was sent (``Recorder.first_token`` was told)


Models = Callable[[], Mapping[str, Sequence[WorkerCard]]]


class Recorder(Protocol):
    registry: CollectorRegistry

    def started(self, model: str) -> None: ...

    def first_token(self, model: str, ttft_s: float) -> None: ...

    def ended(self, o: Outcome) -> None: ...

    def watch(self, models: Models, migration_limit: int | None = None) -> None:
        """The discovery view (and the postprocessor's --migration-limit, where this process knows it)
        that mesh-wide families read when scraped."""


class MeshfrontRecorder:
    """Our families (docs/metrics.md, "Gateway")."""

    def __init__(self, prefix: str = DEFAULT_PREFIX):
        p, r = f"{prefix}_", CollectorRegistry()
        self.registry = r
        self.requests = Counter(f"{p}requests", "Requests by model, endpoint, streaming and HTTP status",
                                ["model", "endpoint", "stream", "status"], registry=r)
        self.in_flight = Gauge(f"{p}inflight_requests", "Requests being served", ["model"], registry=r)
        self.duration = Histogram(f"{p}request_duration_seconds", "Request duration, arrival to last byte",
                                  ["model", "endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram(f"{p}time_to_first_token_seconds", "Arrival to the first generated text",
                              ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(f"{p}inter_token_latency_seconds",
                             "Mean gap between output tokens, one sample per request", ["model"],
                             buckets=ITL_BUCKETS, registry=r)
        self.input_tokens = Counter(f"{p}input_tokens", "Prompt tokens of finished requests", ["model"], registry=r)
        self.output_tokens = Counter(f"{p}output_tokens", "Generated tokens of finished requests", ["model"],
                                     registry=r)
        self.cached_tokens = Counter(f"{p}cached_tokens", "Prompt tokens served from a worker's KV cache",
                                     ["model"], registry=r)
        self.input_lengths = Histogram(f"{p}input_sequence_tokens", "Prompt tokens per finished request",
                                       ["model"], buckets=TOKEN_BUCKETS, registry=r)
        self.output_lengths = Histogram(f"{p}output_sequence_tokens", "Generated tokens per finished request",
                                        ["model"], buckets=TOKEN_BUCKETS, registry=r)
        self.errors = Counter(f"{p}errors", "Failed requests by error reason (INVALID_REQUEST, OVERLOADED, ...)",
                              ["model", "reason"], registry=r)

    def started(self, model: str) -> None:
        self.in_flight.labels(model).inc()

    def first_token(self, model: str, ttft_s: float) -> None:
        self.ttft.labels(model).observe(ttft_s)

    def ended(self, o: Outcome) -> None:
        if o.reason:
            self.errors.labels(o.model, o.reason).inc()
        else:
            self.input_tokens.labels(o.model).inc(o.prompt_tokens)
            self.output_tokens.labels(o.model).inc(o.completion_tokens)
            if o.cached_tokens:
                self.cached_tokens.labels(o.model).inc(o.cached_tokens)
            self.input_lengths.labels(o.model).observe(o.prompt_tokens)
            self.output_lengths.labels(o.model).observe(o.completion_tokens)
            if o.itl_s is not None:
                self.itl.labels(o.model).observe(o.itl_s)
        if o.started:
            self.in_flight.labels(o.model).dec()
            self.duration.labels(o.model, o.endpoint).observe(o.duration_s)
        self.requests.labels(o.model, o.endpoint, "true" if o.stream else "false", o.status).inc()

    def watch(self, models: Models, migration_limit: int | None = None) -> None:
        pass  # our naming keeps the mesh's numbers in each stage's own families (docs/metrics.md)


def log_buckets(lo: float, hi: float, count: int) -> tuple[float, ...]:
    """``count`` log-spaced bounds from ``lo`` to ``hi``, 2 significant digits (Dynamo's histograms)."""
    def two_digits(x: float) -> float:
        return round(x, 1 - math.floor(math.log10(x)))
    return tuple(sorted({two_digits(lo * (hi / lo) ** (i / (count - 1))) for i in range(count)}))


# Our endpoint names -> Dynamo's ``endpoint`` label values; a name not listed is used as it is.
DYNAMO_ENDPOINTS = {"chat": "chat_completions", "completions": "completions", "embeddings": "embeddings",
                    "responses": "responses", "messages": "anthropic_messages"}
# Our error reasons -> Dynamo's ``error_type``; a reason not listed is ``internal``.
DYNAMO_ERROR_TYPES = {"INVALID_REQUEST": "validation", "MODEL_NOT_FOUND": "not_found", "NOT_FOUND": "not_found",
                      "OVERLOADED": "overload", "NO_WORKERS": "overload", "CANCELLED": "cancelled",
                      "NOT_IMPLEMENTED": "not_implemented", "WORKER_FAILED": "internal", "DRAINING": "overload",
                      "INTERNAL": "internal"}


class DynamoRecorder:
    """Dynamo's frontend families (dynamo-frontend.md §9) under ``prefix``.

    One deviation: ``inter_token_latency_seconds`` gets one sample per stream (its mean gap), as ours
    does, where Dynamo observes every token; its sum / count is then a per-request mean.
    """

    def __init__(self, prefix: str = DYNAMO_PREFIX):
        p, r = f"{prefix}_", CollectorRegistry()
        self.registry = r
        self.requests = Counter(f"{p}requests", "Requests by model, endpoint, type and outcome",
                                ["model", "endpoint", "request_type", "status", "error_type"], registry=r)
        self.in_flight = Gauge(f"{p}inflight_requests", "Requests being served", ["model"], registry=r)
        self.duration = Histogram(f"{p}request_duration_seconds", "Request duration", ["model"],
                                  buckets=log_buckets(1, 512, 10), registry=r)
        self.ttft = Histogram(f"{p}time_to_first_token_seconds", "Time to first token", ["model"],
                              buckets=log_buckets(0.001, 480, 18), registry=r)
        self.itl = Histogram(f"{p}inter_token_latency_seconds", "Inter-token latency (mean per stream)", ["model"],
                             buckets=log_buckets(0.001, 2, 13), registry=r)
        self.isl = Histogram(f"{p}input_sequence_tokens", "Input sequence length in tokens", ["model"],
                             buckets=log_buckets(50, 128000, 12), registry=r)
        self.osl = Histogram(f"{p}output_sequence_tokens", "Output sequence length in tokens", ["model"],
                             buckets=log_buckets(50, 32000, 10), registry=r)
        self.cached = Histogram(f"{p}cached_tokens", "Prompt tokens served from a worker's KV cache", ["model"],
                                buckets=log_buckets(50, 128000, 12), registry=r)
        self.output_tokens = Counter(f"{p}output_tokens", "Output tokens generated", ["model"], registry=r)
        self.queued = Gauge(f"{p}queued_requests", "Requests not answered yet: arrival to first token (streams) or "
                            "to the end (unary)", ["model"], registry=r)
        self.disconnected = Gauge(f"{p}disconnected_clients", "Clients that went away before their answer ended",
                                  registry=r)
        self.cancellations = Counter(f"{p}model_cancellation", "Requests cancelled (the client went away)",
                                     ["model", "endpoint", "request_type"], registry=r)
        self.rejections = Counter(f"{p}model_rejection", "Requests refused because every worker was busy",
                                  ["model", "endpoint"], registry=r)
        self.mesh = MeshCollector(prefix, worker_view())
        r.register(self.mesh)

    def watch(self, models: Models, migration_limit: int | None = None) -> None:
        self.mesh.models, self.mesh.migration_limit = models, migration_limit

    def started(self, model: str) -> None:
        self.in_flight.labels(model).inc()
        self.queued.labels(model).inc()

    def first_token(self, model: str, ttft_s: float) -> None:
        self.ttft.labels(model).observe(ttft_s)
        self.queued.labels(model).dec()

    def ended(self, o: Outcome) -> None:
        endpoint, request_type = DYNAMO_ENDPOINTS.get(o.endpoint, o.endpoint), "stream" if o.stream else "unary"
        if o.started and not o.first_token:
            self.queued.labels(o.model).dec()
        if o.reason == "CANCELLED":
            self.cancellations.labels(o.model, endpoint, request_type).inc()
            if o.status == "499":
                self.disconnected.inc()
        elif o.reason == "OVERLOADED":
            self.rejections.labels(o.model, endpoint).inc()
        if not o.reason:
            self.isl.labels(o.model).observe(o.prompt_tokens)
            self.osl.labels(o.model).observe(o.completion_tokens)
            self.cached.labels(o.model).observe(o.cached_tokens)
            self.output_tokens.labels(o.model).inc(o.completion_tokens)
            if o.itl_s is not None:
                self.itl.labels(o.model).observe(o.itl_s)
        if o.started:
            self.in_flight.labels(o.model).dec()
            self.duration.labels(o.model).observe(o.duration_s)
        error_type = DYNAMO_ERROR_TYPES.get(o.reason, "internal") if o.reason else ""
        self.requests.labels(o.model, endpoint, request_type, "error" if o.reason else "success", error_type).inc()


def _worker_type(card: WorkerCard) -> str:
    """Dynamo's worker_type: an aggregated worker decodes, as Dynamo counts it."""
    return "prefill" if card.role == PREFILL else "decode"


class MeshCollector:
    """Dynamo's model-configuration, per-worker, migration and router-queue families, read at scrape time:
    the models from discovery's cards (``models``, set by ``watch``), the loads and last observations from
    this gateway's requests (``WorkerView``). Only registered workers are emitted, so a worker's series go
    when it leaves; a model's configuration gauge takes the largest value among its workers' cards."""

    def __init__(self, prefix: str, view: WorkerView):
        self.p, self.view = f"{prefix}_", view
        self.models: Models = lambda: {}
        self.migration_limit: int | None = None

    def _gauges(self, names: Sequence[tuple[str, str]], labels: Sequence[str]) -> list[GaugeMetricFamily]:
        return [GaugeMetricFamily(self.p + name, doc, labels=labels) for name, doc in names]

    def collect(self) -> Iterator[Metric]:
        models = {name: cards for name, cards in self.models().items() if cards and not cards[0].model.is_media}
        yield from self._model_config(models)
        workers = {c.worker_id: c for cards in models.values() for c in cards}
        self.view.forget(set(workers))
        yield from self._per_worker(workers)
        migrations = CounterMetricFamily(f"{self.p}model_migration", "Requests moved to another worker",
                                         labels=["model", "migration_type"])
        for (model, kind), count in sorted(self.view.migrations.items()):
            migrations.add_metric([model, kind], count)
        yield migrations
        # Counted by the postprocessor (--migration-max-seq-len); not reported to the gateway: 0 here.
        exceeded = CounterMetricFamily(f"{self.p}model_migration_max_seq_len_exceeded",
                                       "Migrations refused because the sequence was longer than allowed",
                                       labels=["model"])
        for model in sorted(models):
            exceeded.add_metric([model], 0)
        yield exceeded
        pending = GaugeMetricFamily(f"{self.p}router_queue_pending_requests",
                                    "Requests this gateway has waiting on the router (its queue for a busy model)",
                                    labels=["worker_type"])
        pending.add_metric(["decode"], self.view.pending_routes)
        yield pending

    def _model_config(self, models: Mapping[str, Sequence[WorkerCard]]) -> Iterator[Metric]:
        fields: list[tuple[str, str, Callable[[WorkerCard], int]]] = [
            ("model_total_kv_blocks", "KV blocks of a worker serving the model", lambda c: c.total_kv_blocks),
            ("model_max_num_batched_tokens", "Tokens one engine step of a worker may batch",
             lambda c: c.max_num_batched_tokens),
            ("model_context_length", "The model's context length in tokens", lambda c: c.model.context_length),
            ("model_kv_cache_block_size", "Tokens per KV block", lambda c: c.model.block_size),
            ("model_max_num_seqs", "Sequences a worker runs at once", lambda c: c.max_num_seqs)]
        for name, doc, read in fields:
            family = GaugeMetricFamily(self.p + name, doc, labels=["model"])
            for model, cards in sorted(models.items()):
                value = max(read(c) for c in cards)
                if value:  # 0: no worker of the model says (an older card, an engine that does not report it)
                    family.add_metric([model], value)
            yield family
        limit = GaugeMetricFamily(f"{self.p}model_migration_limit", "Times a request may move to another worker",
                                  labels=["model"])
        if self.migration_limit is not None:
            for model in sorted(models):
                limit.add_metric([model], self.migration_limit)
        yield limit

    def _per_worker(self, workers: Mapping[str, WorkerCard]) -> Iterator[Metric]:
        labels = ["worker_id", "dp_rank", "worker_type"]
        blocks, prefill, ttft, isl, itl = self._gauges([
            ("worker_active_decode_blocks", "KV blocks of the prompts of this gateway's requests decoding on the "
                                            "worker"),
            ("worker_active_prefill_tokens", "Prompt tokens of this gateway's requests waiting for their first "
                                             "token on the worker"),
            ("worker_last_time_to_first_token_seconds", "The worker's last time to first token"),
            ("worker_last_input_sequence_tokens", "Prompt tokens of that request"),
            ("worker_last_inter_token_latency_seconds", "The worker's last request's mean inter-token gap")], labels)
        view = self.view
        for worker_id, card in sorted(workers.items()):
            ranks = card.dp_ranks  # a worker with data-parallel ranks: a series per rank (services/common/dp_ranks.py)
            for rank in (None,) if ranks is None else ranks:
                target = target_id(worker_id, rank)
                key = [worker_id, str(rank or 0), _worker_type(card)]
                blocks.add_metric(key, -(-view.decode_tokens.get(target, 0) // max(card.model.block_size, 1)))
                prefill.add_metric(key, view.prefill_tokens.get(target, 0))
                last = view.last.get(target)
                if last is not None:
                    for family, value in ((ttft, last.ttft_s), (isl, last.input_tokens), (itl, last.itl_s)):
                        if value is not None:
                            family.add_metric(key, value)
        yield from (blocks, prefill, ttft, isl, itl)


@functools.cache
def _recorder(prefix: str) -> Recorder:
    rec: Recorder = MeshfrontRecorder(prefix) if prefix == DEFAULT_PREFIX else DynamoRecorder(prefix)
    REGISTRY.register(rec.registry)  # the service's --metrics-port shows them too
    return rec


_configured: list[str] = []


def configure(prefix: str) -> Recorder:
    """Picks this process's naming (at start, from ``--metrics-prefix``); every family exists from then on."""
    _configured[:] = [check_prefix(prefix)]
    return _recorder(prefix)


def recorder() -> Recorder:
    """The process's recorder: the configured one, else ours."""
    return _recorder(_configured[0] if _configured else DEFAULT_PREFIX)
