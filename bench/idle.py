"""The ``idle`` scenario: what a mesh at rest costs, per process, and what wakes each one.

Each shape (split, inproc) starts fresh the way ``bench mesh`` starts it, serves a few requests (so that
every lazily opened channel and watch exists, as on a replica that has served traffic), settles, and is
then watched for a window with no requests. Per process it prints the cores used (the sum of the
per-thread nanosecond counters in ``/proc/PID/task/*/schedstat``) and the wake-ups per second: a
thread's voluntary context switches (``/proc/PID/task/TID/status``) count each time it blocked, so each
one it did in the window is one wake-up. Threads are grouped by name (``comm``: grpc's ``grpc_global_tim``,
Envoy's ``wrk:worker_0``, Python's main thread under the process's name), which says whose timer it is
without a profiler attached (a profiler's own sampling would be the largest waker).

The tier is every process but the workers: a worker's heartbeat is the worker's cost, printed apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from bench import mesh
from bench.cli_common import machine_line
from bench.loadgen import LoadSpec, run_load
from bench.prompts import PromptFactory
from bench.stats import summarize
from services.launcher.plan import ROOT

GOAL_CORES = 0.003  # issue 40: the whole tier at rest, and the all-in-one process


@dataclasses.dataclass(frozen=True)
class ThreadCounters:
    cpu_ns: int
    wakeups: int  # voluntary context switches


def read_threads(pid: int) -> dict[str, ThreadCounters]:
    """``tid:name`` -> counters of every live thread of ``pid``; empty when the process is gone."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError):
        return {}
    out = {}
    for tid in tids:
        base = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{base}/schedstat", "rb") as f:
                cpu_ns = int(f.read().split(None, 1)[0])
            with open(f"{base}/status", "rb") as f:
                status = f.read().decode()
        except (FileNotFoundError, ProcessLookupError):  # the thread exited meanwhile
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        out[f"{tid}:{fields['Name'].strip()}"] = ThreadCounters(cpu_ns, int(fields["voluntary_ctxt_switches"]))
    return out


@dataclasses.dataclass
class ProcessIdle:
    name: str
    cores: float
    wakeups_per_s: float
    by_thread: dict[str, tuple[float, float]]  # thread name -> (cores, wake-ups per second), summed per name


def idle_between(name: str, before: Mapping[str, ThreadCounters], after: Mapping[str, ThreadCounters],
                 seconds: float) -> ProcessIdle:
    """A process's idle figures from two ``read_threads`` samples ``seconds`` apart. Threads born inside the
    window count from zero; threads that died in it are missed (an idle process should start none)."""
    by_thread: dict[str, tuple[float, float]] = {}
    for key, now in after.items():
        then = before.get(key, ThreadCounters(0, 0))
        thread = key.split(":", 1)[1]
        cores, wakes = by_thread.get(thread, (0.0, 0.0))
        by_thread[thread] = (cores + (now.cpu_ns - then.cpu_ns) / 1e9 / seconds,
                             wakes + (now.wakeups - then.wakeups) / seconds)
    return ProcessIdle(name, sum(c for c, _ in by_thread.values()), sum(w for _, w in by_thread.values()), by_thread)


def measure(pids: Mapping[str, int], seconds: float) -> list[ProcessIdle]:
    before = {name: read_threads(pid) for name, pid in pids.items()}
    t0 = time.monotonic()
    time.sleep(seconds)
    after = {name: read_threads(pid) for name, pid in pids.items()}
    elapsed = time.monotonic() - t0
    return [idle_between(name, before[name], after[name], elapsed) for name in pids]


def is_worker(name: str) -> bool:
    return mesh.cpu.group_of(name) == "workers"


def report(shape: str, rows: list[ProcessIdle], top: int = 3) -> tuple[str, float]:
    """A text table (one line per process, its busiest wakers) and the tier's cores (workers excluded)."""
    lines = [f"{'process':<16} {'cores':>8} {'wakeups/s':>10}  top wakers (thread: wake-ups/s, cores)"]
    for r in sorted(rows, key=lambda r: (is_worker(r.name), -r.cores)):
        wakers = sorted(r.by_thread.items(), key=lambda kv: -kv[1][1])[:top]
        lines.append(f"{r.name:<16} {r.cores:>8.4f} {r.wakeups_per_s:>10.1f}  "
                     + ", ".join(f"{t}: {w:.1f}/s {c:.4f}" for t, (c, w) in wakers if w or c))
    tier = sum(r.cores for r in rows if not is_worker(r.name))
    lines.append(f"[{shape}] tier at rest (workers excluded): {tier:.4f} cores (goal <= {GOAL_CORES})")
    return "\n".join(lines), tier


def _shapes(text: str) -> tuple[str, ...]:
    shapes = tuple(s.strip() for s in text.split(",") if s.strip())
    bad = [s for s in shapes if s not in mesh.SHAPES]
    if bad or not shapes:
        raise argparse.ArgumentTypeError(f"unknown shape(s) {bad}; choose from {', '.join(mesh.SHAPES)}")
    return shapes


def add_parser(sub) -> None:
    p = sub.add_parser("idle", help="cores per process of a mesh at rest, and what wakes each one")
    p.add_argument("--shape", type=_shapes, default=mesh.SHAPES, help="comma list of split, inproc")
    p.add_argument("--window", type=float, default=30.0, help="seconds measured at rest")
    # At rest means after every connection's idle close: a multiplexed stream's 5 s (mux_client.py), then the
    # server's 15-33 s (grpc_server.py, max_connection_idle_ms).
    p.add_argument("--settle", type=float, default=40.0, help="seconds waited after the last request")
    p.add_argument("--requests", type=int, default=8, help="requests served before settling (opens every "
                   "lazily created channel)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--markdown", default="", help="append the tables to this file")


def run_idle(args: argparse.Namespace, command: str, emit: Callable[[str], None] = print) -> int:
    started = datetime.datetime.now().astimezone()
    emit(f"# {started:%Y-%m-%d %H:%M %Z}; {machine_line()}")
    tables = []
    for shape in args.shape:
        table, _tier = _one_shape(args, shape, emit)
        tables.append((shape, table))
        emit(table)
    if args.markdown:
        with Path(args.markdown).open("a") as f:
            f.write(f"\n### `{command}`\n\n{started:%Y-%m-%d %H:%M %Z}. Machine: {machine_line()}. "
                    f"{args.workers} mocker workers; {args.requests} requests, {args.settle:g} s settle, "
                    f"{args.window:g} s window.\n"
                    + "".join(f"\n{shape}:\n\n```\n{table}\n```\n" for shape, table in tables))
    return 0


def _one_shape(args: argparse.Namespace, shape: str, emit: Callable[[str], None]) -> tuple[str, float]:
    cfg = mesh.MeshBenchConfig(shapes=(shape,), workers=args.workers, speedup=0.0)
    log_dir = ROOT / ".run" / "bench" / f"logs-idle-{shape}-{time.strftime('%Y%m%d-%H%M%S')}"
    emit(f"[{shape}] starting mesh (logs in {log_dir})")
    m = mesh.start_mesh(cfg, shape, log_dir)
    try:
        if args.requests:
            spec = LoadSpec(url=m.url, model=cfg.model_name, concurrency=min(4, args.requests),
                            requests=args.requests, max_tokens=16)
            stats = summarize(mesh.run_async(run_load(spec, PromptFactory(50, seed=1))))
            emit(f"[{shape}] served {stats.ok}/{stats.sent}; settling {args.settle:g} s, then {args.window:g} s "
                 "at rest")
        time.sleep(args.settle)
        pids = {name: p.pid for name, p in m.procs.items()}
        rows = measure(pids, args.window)
        mesh._check_alive(m)
        return report(shape, rows)
    finally:
        problems = m.stop()
        if problems:
            emit(f"[{shape}] teardown problems: {problems}")
