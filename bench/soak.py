"""The ``soak`` scenario: bounded closed-loop load on a fresh mesh for N minutes, watching memory.

A leak shows as resident memory that keeps climbing once caches, pools and allocator arenas have
filled, so the figure that matters is growth *after* a warm-up window, per process: RSS
(``VmRSS`` from ``/proc/<pid>/status``) is sampled every ``sample_s`` seconds and reported at
start, after warm-up and at the end, with the least-squares slope over the post-warm-up samples
(MiB per 10 minutes) so a single allocator step does not read as a trend. The load is closed loop
(``concurrency`` slots, each sending its next request when the previous one ends) with prompts
built on demand, so the client's own memory stays flat however long it runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

from bench.loadgen import chat_body, one_request, open_connections
from bench.mesh import MeshBenchConfig, run_async, start_mesh
from bench.prompts import PromptFactory
from services.launcher.plan import ROOT

Printer = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class SoakConfig:
    minutes: float = 10.0
    warmup_minutes: float = 1.0  # growth is measured from the first sample after this
    concurrency: int = 16
    max_tokens: int = 64
    prompt_tokens: int = 200
    workers: int = 2
    speedup: float = 1.0  # paced mocker: real decode timing, moderate CPU
    sample_s: float = 10.0
    request_timeout_s: float = 60.0
    shape: str = "split"


@dataclasses.dataclass
class SoakCounts:
    ok: int = 0
    errors: int = 0
    cut_at_end: int = 0
    first_errors: list[str] = dataclasses.field(default_factory=list)
    completion_tokens: int = 0


@dataclasses.dataclass
class SoakResult:
    cfg: SoakConfig
    wall_s: float
    counts: SoakCounts
    # (seconds since load start, {process name: RSS KiB}) per sample.
    samples: list[tuple[float, dict[str, int]]]

    def rows(self) -> list[tuple[str, float, float, float, float, float]]:
        """(process, start MiB, after-warm-up MiB, end MiB, growth MiB, slope MiB/10 min) per process."""
        warm_at = self.cfg.warmup_minutes * 60
        first, last = self.samples[0][1], self.samples[-1][1]
        warm = next((s for t, s in self.samples if t >= warm_at), last)
        post = [(t, s) for t, s in self.samples if t >= warm_at]
        out = []
        for name in sorted(first):
            if name not in last:
                continue
            slope = _slope([(t, s[name]) for t, s in post if name in s]) * 600
            out.append((name, first[name] / 1024, warm.get(name, 0) / 1024, last[name] / 1024,
                        (last[name] - warm.get(name, last[name])) / 1024, slope / 1024))
        return out


def _slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope (units per second); 0 with fewer than two points."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    return sum((t - mx) * (v - my) for t, v in points) / var if var else 0.0


def read_rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def sample_rss(pids: dict[str, int]) -> dict[str, int]:
    out = {}
    for name, pid in pids.items():
        kib = read_rss_kib(pid)
        if kib is not None:
            out[name] = kib
    return out


async def _load(url: str, cfg: SoakConfig, model: str, deadline: float, counts: SoakCounts) -> None:
    prompts = PromptFactory(cfg.prompt_tokens)
    conns = await open_connections(url, cfg.concurrency)

    async def slot(conn) -> None:
        while time.monotonic() < deadline:
            body = chat_body(model, prompts.next_prompt(), cfg.max_tokens, True)
            timeout = min(cfg.request_timeout_s, max(0.1, deadline - time.monotonic()))
            r = await one_request(conn, body, timeout)
            if r.ok:
                counts.ok += 1
                counts.completion_tokens += r.completion_tokens
            elif timeout < cfg.request_timeout_s and r.error.startswith("timed out"):
                counts.cut_at_end += 1  # the run's deadline cut it short: not the mesh's error
            else:
                counts.errors += 1
                if len(counts.first_errors) < 5:
                    counts.first_errors.append(r.error)

    try:
        await asyncio.gather(*(slot(c) for c in conns))
    finally:
        for c in conns:
            c.close()


async def drive(url: str, pids: dict[str, int], cfg: SoakConfig, model: str, emit: Printer,
                check: Callable[[], None]) -> SoakResult:
    counts = SoakCounts()
    started = time.monotonic()
    deadline = started + cfg.minutes * 60
    samples = [(0.0, sample_rss(pids))]
    load = asyncio.create_task(_load(url, cfg, model, deadline, counts))
    try:
        while not load.done():
            await asyncio.wait([load], timeout=cfg.sample_s)
            t = time.monotonic() - started
            samples.append((t, sample_rss(pids)))
            total_mib = sum(samples[-1][1].values()) / 1024
            emit(f"[soak] t={t:5.0f}s ok={counts.ok} errors={counts.errors} RSS total {total_mib:.0f} MiB")
            check()
        await load
    finally:
        load.cancel()
    return SoakResult(cfg, time.monotonic() - started, counts, samples)


def run(cfg: SoakConfig, emit: Printer, log_level: str = "WARNING") -> SoakResult:
    mcfg = MeshBenchConfig(shapes=(cfg.shape,), speedup=cfg.speedup, workers=cfg.workers, log_level=log_level)
    log_dir = ROOT / ".run" / "bench" / f"logs-soak-{time.strftime('%Y%m%d-%H%M%S')}"
    emit(f"[soak] starting {cfg.shape} mesh (logs in {log_dir})")
    mesh = start_mesh(mcfg, cfg.shape, log_dir)
    pids = {name: p.pid for name, p in mesh.procs.items()}

    def check() -> None:
        dead = {n: p.returncode for n, p in mesh.procs.items() if p.poll() is not None}
        if dead:
            raise RuntimeError(f"mesh processes exited: {dead}\n{mesh.all_logs()}")

    try:
        return run_async(drive(mesh.url, pids, cfg, mcfg.model_name, emit, check))
    finally:
        problems = mesh.stop()
        if problems:
            emit(f"[soak] teardown problems: {problems}")


def report(result: SoakResult) -> str:
    c, cfg = result.counts, result.cfg
    lines = [
        f"{c.ok} requests ok, {c.errors} errors ({c.cut_at_end} cut by the end of the run) "
        f"in {result.wall_s / 60:.1f} min "
        f"({c.ok / max(result.wall_s, 1e-9):.1f} req/s, {c.completion_tokens} tokens out); "
        f"{len(result.samples)} RSS samples every {cfg.sample_s:g} s, warm-up {cfg.warmup_minutes:g} min."
        + (f" First errors: {c.first_errors}" if c.first_errors else ""),
        "",
        "| process | RSS start MiB | after warm-up | end | growth after warm-up | slope MiB/10 min |",
        "|---|---|---|---|---|---|",
    ]
    lines += [f"| {n} | {a:.1f} | {w:.1f} | {e:.1f} | {g:+.1f} | {s:+.2f} |" for n, a, w, e, g, s in result.rows()]
    return "\n".join(lines)
