"""The arithmetic of ``python -m bench scale``: which stage held a row back, scaling against linear, the table.

Pure functions over what the run measured, so they are unit-tested without namespaces or cgroups.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import statistics
from collections.abc import Mapping, Sequence

from bench.scale_hosts import Throttling

# A stage is the bottleneck when its replicas used at least this share of their quota and were
# throttled in at least this share of the scheduler periods they ran in; an unthrottled process is
# the bottleneck when it used at least this many cores (a Python service has one busy thread).
QUOTA_USED = 0.8
THROTTLED_SHARE = 0.25
PROCESS_CORES = 0.8
MACHINE_BUSY = 0.9  # of every core: other tenants (or the mesh) left nothing to spare

LINEAR_GOAL = 0.9  # throughput per replica against one replica's, while the stage is the bottleneck
CPU_TOLERANCE = 0.10  # CPU per request of the stage against one replica's
CACHED_POINTS = 3.0  # router replicas: cached share within this many points of one router's


def process_group(name: str) -> str:
    """``gateway-2`` -> gateway, ``mocker-1`` -> workers: the replicas of one stage fold together."""
    base = re.sub(r"-\d+$", "", name)
    return "workers" if base == "mocker" else base


@dataclasses.dataclass(frozen=True)
class Verdict:
    bottleneck: str
    evidence: str


def bottleneck(stage: str, window_s: float, quota_cores: float, stage_cpu_ms: float,
               throttling: Sequence[Throttling], other_cpu_ms: Mapping[str, float],
               machine_busy_cores: float, cores: int) -> Verdict:
    """Names what limited a row: the stage under test (at its quota and throttled), else an unthrottled
    process near a full core, else the machine (every core busy), else nothing (the offered load).

    ``stage_cpu_ms`` is the CPU all its replicas used in the window, ``throttling`` their counters' deltas,
    ``other_cpu_ms`` every other process's CPU in the window.
    """
    window_ms = max(window_s, 1e-9) * 1000.0
    capacity_ms = window_ms * quota_cores * max(1, len(throttling))
    used = stage_cpu_ms / capacity_ms
    periods = sum(t.periods for t in throttling)
    throttled = sum(t.throttled for t in throttling) / periods if periods else 0.0
    hottest, hottest_ms = max(other_cpu_ms.items(), key=lambda kv: kv[1], default=("-", 0.0))
    hottest_cores = hottest_ms / window_ms
    evidence = (f"{stage} used {used:.0%} of its quota, throttled in {throttled:.0%} of periods; hottest other "
                f"process {hottest} {hottest_cores:.2f} cores; machine {machine_busy_cores:.2f}/{cores} cores busy")
    if used >= QUOTA_USED and throttled >= THROTTLED_SHARE:
        return Verdict(stage, evidence)
    if hottest_cores >= PROCESS_CORES:
        return Verdict(hottest, evidence)
    if machine_busy_cores >= MACHINE_BUSY * cores:
        return Verdict("machine", evidence)
    return Verdict("none (offered load)", evidence)


@dataclasses.dataclass
class ScaleRow:
    stage: str
    replicas: int
    quota_cores: float
    ok: int
    errors: int
    req_per_s: float
    stage_cpu_ms: float  # per completed request, all its replicas together
    total_cpu_ms: float  # per completed request, every process
    ttft_p50_ms: float
    ttft_p99_ms: float
    verdict: Verdict
    bg_cores: float  # other tenants' CPU during the window
    cached_share: float | None = None  # cached / prompt tokens (the router's kv case)
    label: str = ""  # the case's name when it is not the plain stage ("router-kv")
    # rpc -> (messages per request, chunks per message) each multiplexed hop sent in the window.
    mux: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    # The distinct errors (the first few): "timed out" ones are the streams still open when the row's time ran out.
    error_kinds: tuple[str, ...] = ()
    round: int = 1  # which of ``--rounds`` measured it; 0: the median of every round (``medians``)

    @property
    def name(self) -> str:
        return self.label or self.stage

    @property
    def per_replica(self) -> float:
        return self.req_per_s / self.replicas


# The multiplexed hops by the rpc label of ``meshfront_mux_*`` (services/common/metrics.py), as the table names them.
HOPS = {"worker.GenerateStream": "worker→post", "postprocessor.GenerateStream": "post→gw"}


def mux_per_request(before: Mapping[str, tuple[float, float]], after: Mapping[str, tuple[float, float]],
                    requests: int) -> dict[str, tuple[float, float]]:
    """rpc -> (messages per request, chunks per message) from two scrapes of the ``meshfront_mux_*`` counters
    (rpc -> (messages, chunks), bench.mesh.mux_counts) around a window that completed ``requests``.

    Messages per request is what a hop costs (gRPC's cost is per message); chunks per message is how many
    requests' outputs one message carried. A hop that sent nothing in the window has no figure."""
    out = {}
    for rpc, (messages, chunks) in after.items():
        m0, c0 = before.get(rpc, (0.0, 0.0))
        if messages > m0 and requests > 0:
            out[rpc] = ((messages - m0) / requests, (chunks - c0) / (messages - m0))
    return out


def mux_cell(mux: Mapping[str, tuple[float, float]]) -> str:
    """``worker→post 35.2 (7.1), post→gw 33.0 (7.6)``: messages per request (chunks per message) per hop."""
    if not mux:
        return "—"
    return ", ".join(f"{HOPS.get(rpc, rpc)} {per_req:.1f} ({per_msg:.1f})"
                     for rpc, (per_req, per_msg) in sorted(mux.items(), key=lambda kv: list(HOPS).index(kv[0])
                                                            if kv[0] in HOPS else len(HOPS)))


def against_one(rows: Sequence[ScaleRow]) -> dict[int, tuple[float, float]]:
    """Row index -> (throughput per replica / one replica's, stage CPU per request / one replica's - 1),
    for each row whose case has a one-replica row."""
    one = {r.name: r for r in rows if r.replicas == 1}
    out = {}
    for i, r in enumerate(rows):
        base = one.get(r.name)
        if base is None or base.per_replica <= 0 or base.stage_cpu_ms <= 0:
            continue
        out[i] = (r.per_replica / base.per_replica, r.stage_cpu_ms / base.stage_cpu_ms - 1.0)
    return out


def goal_lines(rows: Sequence[ScaleRow]) -> list[str]:
    """The issue's goals per case: >= 0.9x linear and CPU per request within 10 % while the stage is the
    bottleneck; router replicas: cached share within 3 points of one router."""
    out = []
    ratios = against_one(rows)
    for i, r in enumerate(rows):
        if r.replicas == 1 or i not in ratios:
            continue
        linear, cpu = ratios[i]
        one = next(x for x in rows if x.name == r.name and x.replicas == 1)
        if r.cached_share is not None and one.cached_share is not None:
            points = 100 * (r.cached_share - one.cached_share)
            out.append(f"{r.name} x{r.replicas}: cached share {100 * r.cached_share:.1f} % against "
                       f"{100 * one.cached_share:.1f} % with one router ({points:+.1f} points): "
                       + ("met" if abs(points) <= CACHED_POINTS else "NOT met"))
            continue
        bound = r.verdict.bottleneck == r.stage and one.verdict.bottleneck == r.stage
        met = linear >= LINEAR_GOAL and abs(cpu) <= CPU_TOLERANCE
        status = ("met" if met else "NOT met") if bound else (
            f"not judged: bottleneck {r.verdict.bottleneck} / {one.verdict.bottleneck} at 1 replica")
        out.append(f"{r.name} x{r.replicas}: {linear:.2f}x linear, {r.stage} CPU per request {cpu:+.0%}: {status}")
    return out


def medians(rows: Sequence[ScaleRow]) -> list[ScaleRow]:
    """One row per case and replica count: the median of its rounds' throughput, CPU and TTFT, its errors summed,
    and the bottleneck most of its rounds named (the evidence says how many). A single row of a case at ~0.015
    cores moves by about 20 % between identical runs; the rounds alternate their replica order, so that a drift
    of the machine during a round does not land on one replica count."""
    groups: dict[tuple[str, int], list[ScaleRow]] = collections.defaultdict(list)
    for r in rows:
        groups[(r.name, r.replicas)].append(r)
    out = []
    for same in groups.values():
        first = same[0]
        verdicts = collections.Counter(r.verdict.bottleneck for r in same)
        name, count = verdicts.most_common(1)[0]
        shares = [r.cached_share for r in same if r.cached_share is not None]
        out.append(dataclasses.replace(
            first, ok=sum(r.ok for r in same), errors=sum(r.errors for r in same),
            req_per_s=statistics.median(r.req_per_s for r in same),
            stage_cpu_ms=statistics.median(r.stage_cpu_ms for r in same),
            total_cpu_ms=statistics.median(r.total_cpu_ms for r in same),
            ttft_p50_ms=statistics.median(r.ttft_p50_ms for r in same),
            ttft_p99_ms=statistics.median(r.ttft_p99_ms for r in same),
            verdict=Verdict(name, f"the bottleneck in {count} of {len(same)} rounds"),
            bg_cores=statistics.median(r.bg_cores for r in same),
            cached_share=statistics.median(shares) if shares else None, mux={},
            error_kinds=tuple(sorted({k for r in same for k in r.error_kinds}))[:3], round=0))
    return out


HEADERS = ("stage", "replicas", "quota", "req/s", "req/s/replica", "x linear", "stage CPU ms/req", "vs 1",
           "total CPU ms/req", "TTFT p50", "TTFT p99", "cached", "mux msgs/req (chunks/msg)", "ok/err", "bg cores",
           "bottleneck")


def cells(rows: Sequence[ScaleRow]) -> list[list[str]]:
    ratios = against_one(rows)
    out = []
    for i, r in enumerate(rows):
        linear, cpu = ratios.get(i, (None, None))
        out.append([r.name, str(r.replicas), f"{r.quota_cores:g}", f"{r.req_per_s:.1f}", f"{r.per_replica:.1f}",
                    "—" if linear is None else f"{linear:.2f}", f"{r.stage_cpu_ms:.2f}",
                    "—" if cpu is None else f"{cpu:+.0%}", f"{r.total_cpu_ms:.2f}", f"{r.ttft_p50_ms:.0f}",
                    f"{r.ttft_p99_ms:.0f}", "—" if r.cached_share is None else f"{100 * r.cached_share:.1f} %",
                    mux_cell(r.mux), f"{r.ok}/{r.errors}", f"{r.bg_cores:.2f}", r.verdict.bottleneck])
    return out


def markdown_table(rows: Sequence[ScaleRow]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(c) + " |" for c in cells(rows)]
    return "\n".join(lines)


def text_table(rows: Sequence[ScaleRow]) -> str:
    grid = [list(HEADERS), *cells(rows)]
    widths = [max(len(line[i]) for line in grid) for i in range(len(HEADERS))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in grid)


LEGEND = ("quota = CPU cores per replica (its cgroup's quota: the size of the host it stands for); x linear = "
          "req/s per replica against the one-replica row; vs 1 = the stage's CPU per request (all its replicas) "
          "against the one-replica row; TTFT in ms; cached = cached / prompt tokens; mux = per multiplexed hop "
          "(worker→post: workers to postprocessors, or to all-in-one gateways; post→gw: postprocessors to "
          "gateways), the messages it sent per completed request and (in brackets) the requests' chunks one "
          "message carried; bg cores = CPU other tenants used during the row; bottleneck = what held the row "
          "back (bench/scale_report.py: the stage "
          f"when its replicas used >= {QUOTA_USED:.0%} of their quota and were throttled in >= "
          f"{THROTTLED_SHARE:.0%} of periods, else a process at >= {PROCESS_CORES} cores, else the machine when "
          f">= {MACHINE_BUSY:.0%} of its cores were busy).")
