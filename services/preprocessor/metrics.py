"""The preprocessor's Prometheus families (docs/metrics.md): calls by outcome and their duration."""

from __future__ import annotations

import dataclasses
import functools

from prometheus_client import Counter, Histogram

from services.common.metrics import LATENCY_BUCKETS


@dataclasses.dataclass(frozen=True)
class PreprocessorMetrics:
    requests: Counter
    duration: Histogram


@functools.cache  # once per process: tests build several servers, and names register once
def preprocessor_metrics() -> PreprocessorMetrics:
    p = "meshfront_preprocessor_"
    return PreprocessorMetrics(
        requests=Counter(f"{p}requests", "Preprocess calls by outcome (ok or the error reason)", ["outcome"]),
        duration=Histogram(f"{p}duration_seconds", "Template, tokenization and block hashing of one request",
                           buckets=LATENCY_BUCKETS),
    )
