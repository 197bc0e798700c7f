"""The frontend's request metrics, in Meshfront's naming or Dynamo's, chosen by ``--metrics-prefix``.

The gateway records each request once (``RequestTracker`` in request_metrics.py hands a finished
request's ``Outcome`` to the process's ``Recorder``). Two recorders name the same observations:

- ``meshfront_gateway`` (the default): our families, documented in docs/metrics.md ("Gateway").
- any other prefix, e.g. ``dynamo_frontend``: Dynamo's frontend families with Dynamo's labels and
  label values (``requests_total{model, endpoint="chat_completions", request_type="stream",
  status="success", error_type=""}``, sequence-length histograms, log-spaced buckets), so dashboards
  built for Dynamo work unchanged; docs/metrics.md ("Dynamo naming") lists them.

Each recorder's families live in their own registry: the gateway's ``--metrics-port`` serves them
beside everything else (the registry is registered into prometheus-client's global one), and the
edge's ``/metrics`` (services/gateway/edge/) serves exactly them, for every replica.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Protocol

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from services.common.metrics import ITL_BUCKETS, LATENCY_BUCKETS

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


class Recorder(Protocol):
    registry: CollectorRegistry

    def started(self, model: str) -> None: ...

    def first_token(self, model: str, ttft_s: float) -> None: ...

    def ended(self, o: Outcome) -> None: ...


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

    def started(self, model: str) -> None:
        self.in_flight.labels(model).inc()

    def first_token(self, model: str, ttft_s: float) -> None:
        self.ttft.labels(model).observe(ttft_s)

    def ended(self, o: Outcome) -> None:
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
        self.requests.labels(o.model, DYNAMO_ENDPOINTS.get(o.endpoint, o.endpoint),
                             "stream" if o.stream else "unary", "error" if o.reason else "success", error_type).inc()


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
