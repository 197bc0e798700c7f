"""Prometheus metrics: one set per service, served on ``--metrics-port`` (0 = off).

Names are documented in docs/metrics.md and follow Dynamo's where they overlap
(dynamo-frontend.md §9), with a ``meshfront_<service>_`` prefix. Updates happen once per request or
per message, never per token: token counts are added when a request ends, the inter-token latency is
the request's mean gap, and load gauges are read from the live objects at scrape time (custom
collectors, e.g. the router's in services/router/metrics.py), so the hot path pays nothing for them.

The router's own metrics (decisions, KV prediction accuracy, event lag, per-worker load) live in
services/router/metrics.py with their own registry.

Each set is created once per process (``postprocessor_metrics()`` ...) so that the all-in-one
gateway, which hosts the router and postprocessor in-process, and tests that build several service
objects register every name exactly once. The gateway's request metrics are in
services/gateway/frontend_metrics.py: their names follow ``--metrics-prefix`` and the edge's
``/metrics`` serves them.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

from prometheus_client import Counter, Gauge, Histogram, start_http_server

log = logging.getLogger(__name__)

# Latency buckets in seconds: TTFT from a few ms (cache hit, mocker) to minutes (long prefill queue).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)


def serve_metrics(port: int, host: str = "0.0.0.0") -> bool:  # noqa: S104 - scraped from other pods
    """Starts the ``/metrics`` HTTP endpoint in a daemon thread; returns whether it started."""
    if port <= 0:
        return False
    start_http_server(port, addr=host)
    log.info("metrics on http://%s:%d/metrics", host, port)
    return True


@dataclasses.dataclass(frozen=True)
class PreprocessorMetrics:
    requests: Counter
    duration: Histogram


@functools.cache
def preprocessor_metrics() -> PreprocessorMetrics:
    p = "meshfront_preprocessor_"
    return PreprocessorMetrics(
        requests=Counter(f"{p}requests", "Preprocess calls by outcome (ok or the error reason)", ["outcome"]),
        duration=Histogram(f"{p}duration_seconds", "Template, tokenization and block hashing of one request",
                           buckets=LATENCY_BUCKETS),
    )


@dataclasses.dataclass(frozen=True)
class PostprocessorMetrics:
    streams: Counter
    in_flight: Gauge
    worker_failures: Counter
    migrations: Counter


@functools.cache
def postprocessor_metrics() -> PostprocessorMetrics:
    p = "meshfront_postprocessor_"
    return PostprocessorMetrics(
        streams=Counter(f"{p}streams", "Generate streams by outcome (finished, cancelled, failed)", ["outcome"]),
        in_flight=Gauge(f"{p}inflight_streams", "Generate streams being relayed"),
        worker_failures=Counter(f"{p}worker_failures", "Worker streams that failed, by reason", ["reason"]),
        migrations=Counter(f"{p}migrations", "Requests moved to another worker after a failure"),
    )


@dataclasses.dataclass(frozen=True)
class WorkerMetrics:
    requests: Counter
    in_flight: Gauge


@functools.cache
def worker_metrics() -> WorkerMetrics:
    p = "meshfront_worker_"
    return WorkerMetrics(
        requests=Counter(f"{p}requests", "Sequences by outcome (finished, aborted, rejected, failed)", ["outcome"]),
        in_flight=Gauge(f"{p}inflight_requests", "Sequences being generated or waiting"),
    )


@dataclasses.dataclass(frozen=True)
class MuxMetrics:
    messages: Counter
    chunks: Counter


@functools.cache
def mux_metrics() -> MuxMetrics:
    """What the serving side of each ``GenerateStream`` sent: chunks / messages is how many requests'
    output one message carried (services/common/mux_session.py); counted per message, not per chunk."""
    p = "meshfront_mux_"
    return MuxMetrics(
        messages=Counter(f"{p}messages", "GenerateStream response messages sent", ["rpc"]),
        chunks=Counter(f"{p}chunks", "Sequence chunks those messages carried", ["rpc"]),
    )


@dataclasses.dataclass(frozen=True)
class EmbedMetrics:
    batch_inputs: Histogram


@functools.cache
def embed_metrics() -> EmbedMetrics:
    """The embedding worker's batching: how many inputs each forward pass carried."""
    return EmbedMetrics(batch_inputs=Histogram(
        "meshfront_worker_embed_batch_inputs", "Inputs per forward pass of an embedding worker",
        buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256)))
