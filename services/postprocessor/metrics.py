"""The postprocessor's Prometheus families (docs/metrics.md): streams, worker failures, migrations, resumes."""

from __future__ import annotations

import dataclasses
import functools

from prometheus_client import Counter, Gauge


@dataclasses.dataclass(frozen=True)
class PostprocessorMetrics:
    streams: Counter
    in_flight: Gauge
    worker_failures: Counter
    migrations: Counter
    resumes: Counter
    migration_max_seq_len_exceeded: Counter


@functools.cache  # once per process: the all-in-one process and tests build several postprocessors
def postprocessor_metrics() -> PostprocessorMetrics:
    p = "meshfront_postprocessor_"
    return PostprocessorMetrics(
        streams=Counter(f"{p}streams", "Generate streams by outcome (finished, cancelled, failed)", ["outcome"]),
        in_flight=Gauge(f"{p}inflight_streams", "Generate streams being relayed"),
        worker_failures=Counter(f"{p}worker_failures", "Worker streams that failed, by reason", ["reason"]),
        migrations=Counter(f"{p}migrations", "Requests moved to another worker after a failure"),
        resumes=Counter(f"{p}resumes", "Requests taken over mid-stream from a replica that went away"),
        migration_max_seq_len_exceeded=Counter(
            f"{p}migration_max_seq_len_exceeded",
            "Requests not migrated after a worker failure because prompt + generated tokens exceeded "
            "--migration-max-seq-len", ["model"]),
    )
