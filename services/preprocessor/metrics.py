"""The preprocessor's Prometheus families (docs/metrics.md): calls by outcome and their duration, and the prefix
cache's counts (core/prefix_cache.py), read from the caches when scraped."""

from __future__ import annotations

import dataclasses
import functools

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from services.common.metrics import LATENCY_BUCKETS
from services.preprocessor.core import prefix_cache


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


class PrefixCacheCollector:
    """The process's prefix caches, summed: what a request adds is counted by the cache itself, under its lock,
    and read here only when Prometheus scrapes."""

    def collect(self):
        p = "meshfront_preprocessor_prefix_cache_"
        caches = list(prefix_cache.LIVE)
        lookups = CounterMetricFamily(f"{p}lookups", "Chat prompts through the prefix cache by result (hit: an "
                                      "earlier turn's ids reused; fallback: encoded whole after a failed check)",
                                      labels=["result"])
        tokens = CounterMetricFamily(f"{p}prompt_tokens", "Prompt tokens of cached lookups, reused from an earlier "
                                     "turn or encoded", labels=["source"])
        lookups.add_metric(["hit"], sum(c.stats.hits for c in caches))
        lookups.add_metric(["miss"], sum(c.stats.misses for c in caches))
        lookups.add_metric(["fallback"], sum(c.stats.fallbacks for c in caches))
        tokens.add_metric(["reused"], sum(c.stats.reused_tokens for c in caches))
        tokens.add_metric(["encoded"], sum(c.stats.encoded_tokens for c in caches))
        size = GaugeMetricFamily(f"{p}bytes", "Bytes the prefix cache holds (--tokenizer-prefix-cache-bytes bounds it)",
                                 value=sum(c.size_bytes for c in caches))
        yield from (lookups, tokens, size)


@functools.cache  # once per process, like the families above
def register_prefix_cache_collector() -> None:
    REGISTRY.register(PrefixCacheCollector())
