"""Rows of a level (latency + CPU per request) rendered as a fixed-width table or as markdown."""

from __future__ import annotations

import dataclasses
import math

from bench.cpu import GROUPS
from bench.stats import LevelStats

SHORT = {"envoy": "envoy", "gateway": "gw", "preprocessor": "pre", "router": "route", "postprocessor": "post",
         "workers": "workers", "nats": "nats"}


@dataclasses.dataclass(frozen=True)
class Row:
    shape: str
    stats: LevelStats
    cpu_per_request: dict[str, float]  # group -> ms, plus "total"
    client_cpu_per_request: float
    window_cpu_ms: float


HEADERS = (["shape", "conc", "req/s", "TTFT p50", "p90", "p99", "ITL p50", "p99", "tok/read"]
           + [SHORT[g] for g in GROUPS] + ["total", "client", "ok/err"])


def _num(v: float | None, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return f"{v:.{digits}f}"


def cells(row: Row) -> list[str]:
    s = row.stats
    cpu = [_num(row.cpu_per_request.get(g), 2) for g in GROUPS]
    return ([row.shape, str(s.concurrency), _num(s.req_per_s), _num(s.ttft_ms[50]), _num(s.ttft_ms[90]),
             _num(s.ttft_ms[99]), _num(s.itl_ms[50], 2), _num(s.itl_ms[99], 2), _num(s.tokens_per_arrival, 1)]
            + cpu + [_num(row.cpu_per_request.get("total"), 2), _num(row.client_cpu_per_request, 2),
                     f"{s.ok}/{s.errors}"])


def text_table(rows: list[Row]) -> str:
    grid = [HEADERS] + [cells(r) for r in rows]
    widths = [max(len(line[i]) for line in grid) for i in range(len(HEADERS))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in grid]
    return "\n".join(lines)


def markdown_table(rows: list[Row]) -> str:
    out = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    out += ["| " + " | ".join(cells(r)) + " |" for r in rows]
    return "\n".join(out)


LEGEND = ("Latencies in ms (TTFT from request write to first content; ITL per token, an arrival's gap "
          "split over the tokens it carried; tok/read = tokens per socket read). CPU columns are CPU-ms "
          "per completed request per process group (thread schedstat sums, cross-checked with "
          "/proc/<pid>/stat), `total` is their sum; `client` is the load generator itself (not in total). "
          "`—` = process not in this shape.")
