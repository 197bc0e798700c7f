"""The ``mesh`` scenario: a fresh mesh per shape, warm-up, then one closed-loop level per concurrency.

Each level opens its connections first, then samples every server process's CPU, the load
generator's own and the machine's, runs the load, and samples again; the row reports latency
percentiles and CPU-ms per completed request. The machine's busy time minus the mesh and the client
gives the CPU other tenants used in the window (``bg cores``), which says how noisy a row is.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import statistics
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from bench import cpu
from bench.loadgen import LoadSpec, open_connections, run_load
from bench.prompts import PromptFactory
from bench.report import Row
from bench.stats import LevelStats, summarize
from services.launcher.plan import ROOT, WorkerSpec, ephemeral_plan
from services.launcher.processes import Mesh

SHAPES = ("split", "inproc")
PEER = "dynamo"  # Dynamo's own frontend and mocker, measured the same way (bench/dynamo_peer.py)
FLOOR = "edge"  # Envoy and a stand-in gateway answering pre-rendered chunks: the design's floor (bench/edge_floor.py)
SPLIT_FLOOR = "edge-split"  # the split shape's hops with stand-in stages and no logic (bench/split_floor.py)


@dataclasses.dataclass(frozen=True)
class MeshBenchConfig:
    shapes: tuple[str, ...] = SHAPES
    concurrency: tuple[int, ...] = (1, 8, 32, 128)
    requests: int | None = None  # per level; None = max(200, 8 * concurrency)
    prompt_tokens: int = 200
    max_tokens: int = 64
    speedup: float = 100.0  # mocker --speedup-ratio; 0 = instant
    workers: int = 2
    gateways: int = 1  # gateway processes behind Envoy (all-in-one processes in the inproc shape)
    warmup: int = 32
    shared_prefix_tokens: int = 0
    level_timeout_s: float = 120.0
    router_mode: str = "round-robin"
    model_name: str = "meshfront/demo-qwen"
    worker_flags: tuple[str, ...] = ()
    postprocessor_flags: tuple[str, ...] = ()  # split shape only (inproc has no postprocessor process)
    gateway_flags: tuple[str, ...] = ()  # both shapes (e.g. --stream-interval=4)
    log_level: str = "WARNING"
    seed: int | None = None
    idle_s: float = 3.0  # idle-CPU baseline measured after warm-up; 0 skips it
    profile_dir: str = ""  # py-spy profiles of every measured level go here (bench/profile.py); "" = none
    profile_processes: tuple[str, ...] = ("gateway", "postprocessor")
    profile_native: bool = False  # C and Cython frames too (py-spy --native)
    otlp_endpoint: str = ""  # tracing on: every process and Envoy send spans to this OTLP/gRPC collector

    def requests_for(self, concurrency: int) -> int:
        return self.requests if self.requests else max(200, 8 * concurrency)


@dataclasses.dataclass
class LevelRecord:
    row: Row
    bg_cores: float  # CPU other tenants used during the window, in cores
    loadavg: float
    idle_ms_per_s: dict[str, float] = dataclasses.field(default_factory=dict)  # the shape's idle baseline
    # Per multiplexed hop (worker.GenerateStream, postprocessor.GenerateStream): request outputs per message.
    chunks_per_message: dict[str, float] = dataclasses.field(default_factory=dict)


Printer = Callable[[str], None]


def start_mesh(cfg: MeshBenchConfig, shape: str, log_dir: Path) -> Mesh:
    from services.models.build import build_demo_model

    model_dir = str(build_demo_model(ROOT / "build" / "models" / "demo-qwen"))
    if shape == PEER:
        from bench import dynamo_peer

        return dynamo_peer.start(log_dir, model_dir, cfg.model_name, cfg.workers, cfg.speedup, cfg.router_mode)
    if shape == FLOOR:
        from bench.edge_floor import EdgeFloorMesh

        return EdgeFloorMesh(log_dir, cfg.speedup).start()
    if shape == SPLIT_FLOOR:
        from bench.split_floor import SplitFloorMesh

        return SplitFloorMesh(log_dir, cfg.speedup).start()
    extra = ("--speedup-ratio", f"{cfg.speedup:g}", *cfg.worker_flags)
    workers = [WorkerSpec(model_dir, cfg.model_name, "mocker", extra) for _ in range(cfg.workers)]
    plan = ephemeral_plan(workers, cfg.gateways, inproc=shape == "inproc", router_mode=cfg.router_mode,
                          run_dir=ROOT / ".run" / "bench", log_level=cfg.log_level,
                          service_args={"postprocessor": cfg.postprocessor_flags, "gateway": cfg.gateway_flags},
                          otlp_endpoint=cfg.otlp_endpoint)
    mesh = Mesh(plan, log_dir)
    try:
        mesh.start(timeout=90)
    except BaseException:
        mesh.stop()
        raise
    return mesh


def _check_alive(mesh: Mesh) -> None:
    dead = {n: p.returncode for n, p in mesh.procs.items() if p.poll() is not None}
    if dead:
        raise RuntimeError(f"mesh processes exited: {dead}\n" + "\n".join(
            f"--- {n}\n{mesh.logs(n)}" for n in dead))


async def measure_level(url: str, pids: dict[str, int], cfg: MeshBenchConfig, shape: str, concurrency: int,
                        prompts: PromptFactory, emit: Printer, metrics_ports: Sequence[int] = ()) -> LevelRecord:
    spec = LoadSpec(url=url, model=cfg.model_name, concurrency=concurrency,
                    requests=cfg.requests_for(concurrency), max_tokens=cfg.max_tokens,
                    duration_s=cfg.level_timeout_s, request_timeout_s=min(60.0, cfg.level_timeout_s))
    profiler = None
    if cfg.profile_dir:
        from bench.profile import Profiler

        profiler = Profiler(Path(cfg.profile_dir), pids, cfg.profile_processes, native=cfg.profile_native)
        profiler.start(f"{shape}-c{concurrency}")
    mux_before = mux_counts(metrics_ports)
    try:
        m = await measured_load(spec, prompts, pids, f"[{shape}] c={concurrency}", emit)
    finally:
        if profiler is not None:
            from bench.profile import report

            emit(report(f"[{shape}] c={concurrency} profile", profiler.stop()))
    row = Row(shape=shape, stats=m.stats, cpu_per_request=m.usage.per_request(m.stats.ok),
              client_cpu_per_request=m.client_ms / max(1, m.stats.ok), window_cpu_ms=m.usage.total_ms)
    return LevelRecord(row, bg_cores=m.bg_cores, loadavg=os.getloadavg()[0],
                       chunks_per_message=chunks_per_message(mux_before, mux_counts(metrics_ports)))


def mux_counts(endpoints: Sequence[int | str]) -> dict[str, tuple[float, float]]:
    """rpc -> (messages, chunks) the mesh's GenerateStream servers sent so far, over every scraped process.
    An endpoint is a loopback port or ``host:port`` (the scale bench's processes each have a host)."""
    out: dict[str, tuple[float, float]] = {}
    for endpoint in endpoints:
        where = f"127.0.0.1:{endpoint}" if isinstance(endpoint, int) else endpoint
        try:
            with urllib.request.urlopen(f"http://{where}/metrics", timeout=2) as r:
                text = r.read().decode()
        except OSError:
            continue  # a process without metrics (or gone): its hop is just not reported
        for family in text_string_to_metric_families(text):
            if family.name not in ("meshfront_mux_messages", "meshfront_mux_chunks"):
                continue
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    messages, chunks = out.get(sample.labels["rpc"], (0.0, 0.0))
                    if family.name == "meshfront_mux_messages":
                        messages += sample.value
                    else:
                        chunks += sample.value
                    out[sample.labels["rpc"]] = (messages, chunks)
    return out


def chunks_per_message(before: dict[str, tuple[float, float]],
                       after: dict[str, tuple[float, float]]) -> dict[str, float]:
    out = {}
    for rpc, (messages, chunks) in after.items():
        m0, c0 = before.get(rpc, (0.0, 0.0))
        if messages > m0:
            out[rpc] = (chunks - c0) / (messages - m0)
    return out


@dataclasses.dataclass
class MeasuredLoad:
    stats: LevelStats
    usage: cpu.CpuUsage
    client_ms: float  # the load generator's own CPU
    bg_cores: float  # CPU other tenants used meanwhile, in cores


async def measured_load(spec: LoadSpec, prompts: PromptFactory, pids: dict[str, int], label: str,
                        emit: Printer) -> MeasuredLoad:
    """Runs ``spec`` and reads every process's CPU, the client's and the machine's around it."""
    conns = await open_connections(spec.url, spec.concurrency)
    me = os.getpid()
    before, client0, machine0 = cpu.sample(pids), cpu.read_threads_cpu_ms(me), cpu.read_machine_busy_ms()
    load = await run_load(spec, prompts, conns)
    after, client1, machine1 = cpu.sample(pids), cpu.read_threads_cpu_ms(me), cpu.read_machine_busy_ms()
    for c in conns:
        c.close()
    usage = cpu.usage_between(before, after)
    if usage.missing or usage.disagreements():
        emit(f"{label}: CPU accounting caveat: gone {usage.missing}, schedstat vs ticks {usage.disagreements()}")
    client_ms = client1 - client0
    bg_ms = max(0.0, (machine1 - machine0) - usage.total_ms - client_ms)
    return MeasuredLoad(summarize(load), usage, client_ms, bg_ms / 1000.0 / max(load.wall_s, 1e-9))


async def drive(url: str, pids: dict[str, int], cfg: MeshBenchConfig, shape: str, emit: Printer,
                check: Callable[[], None] = lambda: None, metrics_ports: Sequence[int] = ()) -> list[LevelRecord]:
    """Warm-up, then one measured level per concurrency; ``check`` raises if the mesh broke."""
    prompts = PromptFactory(cfg.prompt_tokens, shared_prefix_tokens=cfg.shared_prefix_tokens, seed=cfg.seed)
    await cold_start(url, cfg, shape, prompts, emit)
    if cfg.warmup:
        warm = LoadSpec(url=url, model=cfg.model_name, concurrency=min(8, cfg.warmup), requests=cfg.warmup,
                        max_tokens=cfg.max_tokens, duration_s=cfg.level_timeout_s)
        stats = summarize(await run_load(warm, prompts))
        emit(f"[{shape}] warm-up: {stats.ok}/{stats.sent} ok"
             + (f"; errors: {stats.first_errors}" if stats.errors else ""))
        if not stats.ok:
            check()
            raise RuntimeError(f"warm-up failed: {stats.first_errors}")
    idle = await idle_cpu_per_s(pids, cfg.idle_s) if cfg.idle_s > 0 else {}
    if idle:
        emit(f"[{shape}] idle CPU, ms per second: " + fmt_groups(idle))
    records = []
    for c in cfg.concurrency:
        check()
        rec = await measure_level(url, pids, cfg, shape, c, prompts, emit, metrics_ports)
        rec.idle_ms_per_s = idle
        s = rec.row.stats
        emit(f"[{shape}] c={c}: {s.ok}/{s.sent} ok in {s.wall_s:.1f}s, {s.req_per_s:.1f} req/s, "
             f"CPU {rec.row.cpu_per_request['total']:.2f} ms/req (window {rec.row.window_cpu_ms:.0f} ms), "
             f"bg {rec.bg_cores:.2f} cores, prompt {s.mean_prompt_tokens:.0f} tok, cached {s.mean_cached_tokens:.0f}"
             + "".join(f", {rpc} {n:.1f} per message" for rpc, n in rec.chunks_per_message.items())
             + (f"; errors: {s.first_errors}" if s.errors else ""))
        records.append(rec)
    check()
    return records


IDLE_GAP_S = 2.0  # before the first request and before each warm one it is compared with
GAP_SAMPLES = 5


async def cold_start(url: str, cfg: MeshBenchConfig, shape: str, prompts: PromptFactory, emit: Printer) -> None:
    """The first request a fresh mesh serves against warm ones, one at a time (TTFT).

    A request after an idle gap pays every process's wake-up (on this machine ~1.2x a back-to-back
    one in the split shape), so the first request waits the same gap and is compared with warm requests
    after that gap, which isolates what is cold; the back-to-back ratio is printed too.
    """
    one = LoadSpec(url=url, model=cfg.model_name, concurrency=1, requests=1, max_tokens=cfg.max_tokens,
                   duration_s=cfg.level_timeout_s)
    errors: list[str] = []

    async def ttft(spec: LoadSpec) -> float:
        stats = summarize(await run_load(spec, prompts))
        errors.extend(stats.first_errors if stats.errors else ())
        return stats.ttft_ms[50]

    await asyncio.sleep(IDLE_GAP_S)
    cold = await ttft(one)
    back_to_back = await ttft(dataclasses.replace(one, requests=10))
    after_gap = []
    for _ in range(GAP_SAMPLES):
        await asyncio.sleep(IDLE_GAP_S)
        after_gap.append(await ttft(one))
    warm = statistics.median(after_gap)
    if errors:
        emit(f"[{shape}] cold start: errors {errors[:3]}")
    emit(f"[{shape}] cold start: first request TTFT {cold:.1f} ms (after {IDLE_GAP_S:g} s idle); warm after the "
         f"same idle p50 {warm:.1f} ms (ratio {cold / warm:.2f}); warm back-to-back p50 {back_to_back:.1f} ms "
         f"(ratio {cold / back_to_back:.2f})")


async def idle_cpu_per_s(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """CPU the mesh burns with no requests (heartbeats, polling), per group, in ms per second."""
    before = cpu.sample(pids)
    await asyncio.sleep(seconds)
    usage = cpu.usage_between(before, cpu.sample(pids))
    out = {g: ms / seconds for g, ms in usage.by_group().items()}
    out["total"] = usage.total_ms / seconds
    return out


def fmt_groups(values: dict[str, float]) -> str:
    return ", ".join(f"{g} {v:.1f}" for g, v in values.items() if v or g == "total")


def run_shape(cfg: MeshBenchConfig, shape: str, emit: Printer) -> list[LevelRecord]:
    """Starts a mesh of ``shape``, measures every level and stops it; raises with logs if it breaks."""
    log_dir = ROOT / ".run" / "bench" / f"logs-{shape}-{time.strftime('%Y%m%d-%H%M%S')}"
    emit(f"[{shape}] starting mesh (logs in {log_dir})")
    mesh = start_mesh(cfg, shape, log_dir)
    emit(f"[{shape}] mesh up at {mesh.url}: {', '.join(sorted(mesh.procs))}")
    try:
        pids = {name: p.pid for name, p in mesh.procs.items()}
        metrics_ports = [] if shape in (PEER, FLOOR, SPLIT_FLOOR) else list(mesh.plan.metrics_ports.values())
        return run_async(drive(mesh.url, pids, cfg, shape, emit, check=lambda: _check_alive(mesh),
                               metrics_ports=metrics_ports))
    except BaseException:
        emit(f"[{shape}] failed; last log lines:\n{mesh.all_logs()}")
        raise
    finally:
        problems = mesh.stop()
        if problems:
            emit(f"[{shape}] teardown problems: {problems}")


def run_async(coro):
    """Runs on uvloop when installed: the client's own CPU is part of the noise on two cores."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)
