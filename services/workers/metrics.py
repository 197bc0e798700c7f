"""Every worker kind's Prometheus families (docs/metrics.md), and the embedding worker's batching."""

from __future__ import annotations

import dataclasses
import functools

from prometheus_client import Counter, Gauge, Histogram


@dataclasses.dataclass(frozen=True)
class WorkerMetrics:
    requests: Counter
    in_flight: Gauge
    # 1, labelled by what the card says: a query joins on it to split any worker series by role
    # (prefill, decode, both), kind or model, whatever the scraper's own labels.
    info: Gauge
    # Tokens the sequences sent, counted once each sequence ends (a prefill worker's: one per prefill leg).
    output_tokens: Counter
    # Prompt tokens of the sequences, and those the engine found in its KV cache (a decode worker's: the
    # transferred ones), from each first output: their ratio is the worker's cache hit rate.
    prompt_tokens: Counter
    cached_prompt_tokens: Counter


@functools.cache  # once per process: tests build several workers, and names register once
def worker_metrics() -> WorkerMetrics:
    p = "meshfront_worker_"
    return WorkerMetrics(
        requests=Counter(f"{p}requests", "Sequences by outcome (finished, aborted, rejected, failed)", ["outcome"]),
        in_flight=Gauge(f"{p}inflight_requests", "Sequences being generated or waiting"),
        info=Gauge(f"{p}info", "1 per worker process: its role in disaggregated serving, kind and model",
                   ["role", "kind", "model"]),
        output_tokens=Counter(f"{p}output_tokens", "Tokens generated, counted as each sequence ends"),
        prompt_tokens=Counter(f"{p}prompt_tokens", "Prompt tokens of the sequences, as the engine counted them"),
        cached_prompt_tokens=Counter(f"{p}cached_prompt_tokens",
                                     "Prompt tokens the engine found in its KV cache (prefix hits or transferred)"),
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
