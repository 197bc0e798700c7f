"""The ``disagg`` scenario: the same number of mocker workers aggregated and disaggregated, Meshfront's and
Dynamo 1.6.1's, on one mixed load at the mocker's real pace (issue 19's bench).

Shapes (each a fresh mesh, one measured closed-loop level, then torn down):

- ``agg``: N mockers (role both) behind the split mesh, kv router;
- ``disagg``: 1 prefill + N-1 decode mockers (``--disaggregation-mode``), kv router: every request runs as two
  legs (conditional disaggregation off, as Dynamo's default is), one after the other (vLLM's NIXL pull: the
  transfer starts once the prefill is done);
- ``disagg-overlap``: the same with ``--kv-transfer-overlap``: both legs at once (the paired order), the transfer
  streamed layer by layer during the prefill, as SGLang's Mooncake transfer is (services/workers/mocker/transfer.py);
- ``dynamo-agg`` / ``dynamo-disagg``: Dynamo's frontend (kv router) and N of its own mockers, the second with
  one in ``--disaggregation-mode prefill`` and the rest ``decode`` (bench/dynamo_peer.py).

Meshfront's shapes run behind the split mesh, or with ``--allinone`` behind the all-in-one gateway (one process
for the gateway and every stage, as Dynamo's frontend is one process).

The load: ``concurrency`` slots, each request long (``long_min``..``long_max`` words, about as many tokens) with
probability ``long_share``, else a short chat (``short_min``..``short_max``), every request ``max_tokens`` out
(ignore_eos). The demo model's window (4096) is too small for 8k prompts, so both meshes serve a copy of it
whose config says 32768. Reported per shape: TTFT and per-token ITL p50/p99, the first-to-second token gap and the
ITL p99 after it (``handover_split``), throughput, and the frontend's CPU
per request (every process but the workers and NATS: Envoy, gateway, preprocessor, router, postprocessor;
Dynamo's frontend) and the workers' (our mockers are Python, Dynamo's Rust: on shared cores theirs leave more
CPU to everything else), and, for Meshfront's shapes, the share of the prompt tokens the decode (or whole-request)
workers found in their KV cache, from their ``meshfront_worker_cached_prompt_tokens`` counters (a decode worker's
are the transferred ones; the client's usage reports the prefill leg's).
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from bench import cpu
from bench.loadgen import LoadResult, LoadSpec, open_connections, run_load
from bench.mesh import Printer, run_async
from bench.profile import Profiler
from bench.profile import report as profile_report
from bench.prompts import WORDS, PromptFactory
from bench.stats import percentile, summarize
from services.launcher.plan import ROOT, MeshPlan, WorkerSpec, ephemeral_plan
from services.launcher.processes import Mesh

SHAPES = ("agg", "disagg", "disagg-overlap", "dynamo-agg", "dynamo-disagg")
DISAGGREGATED = ("disagg", "disagg-overlap")  # Meshfront's disaggregated shapes
CONTEXT = 32768
# Both mockers model the same KV transfer: Meshfront's defaults (an 8B model's 128 KiB per token over a 25 GB/s
# NIC, services/workers/mocker/transfer.py) given to Dynamo's mocker, and the same 16-token blocks.
DYNAMO_MOCKER_FLAGS = ("--block-size", "16", "--kv-bytes-per-token", str(128 * 1024), "--kv-transfer-bandwidth", "25")
# ... and the same engine speed: Dynamo 1.6.1's mocker step times (its PerfModel::Polynomial, whose constants are
# in its _core binary) given to ours. Its decode polynomial is our default; its prefill is ~4x faster than our
# default (6k tokens: ~123 ms against ~516 ms), which alone made our TTFT look worse (mocker/timing.py).
DYNAMO_PREFILL_MS = {"--prefill-ms-const": 16.50142, "--prefill-ms-per-token": 1.518344e-2,
                     "--prefill-ms-per-token-sq": 4.209989e-7}
TIMING_MODEL = ("both sides on Dynamo 1.6.1's mocker timing: prefill step 16.50142 + 1.518344e-2 n + 4.209989e-7 n^2 "
                "ms for n uncached tokens, decode step 5.74 + 54.01 u - 25.74 u^2 ms at KV use u, / speed-up")
FRONTEND_EXCLUDES = ("workers", "nats")
PROFILED = ("gateway", "preprocessor", "router", "postprocessor", "mocker")


@dataclasses.dataclass(frozen=True)
class DisaggBenchConfig:
    shapes: tuple[str, ...] = SHAPES
    workers: int = 4  # disaggregated: 1 prefill + workers-1 decode
    concurrency: int = 16
    requests: int = 96
    long_share: float = 0.25
    long_min: int = 4000
    long_max: int = 8000
    short_min: int = 50
    short_max: int = 300
    max_tokens: int = 128
    speedup: float = 1.0  # the mocker's real pace
    warmup: int = 8
    level_timeout_s: float = 150.0
    model_name: str = "meshfront/demo-qwen"
    seed: int | None = None
    # Several seeds: every shape runs once per seed (the shapes alternate within a seed), and a pooled table
    # follows the per-seed ones. A p99 of one run's ~300 requests is its third-worst; pooled, it rests on many.
    seeds: tuple[int, ...] = ()
    log_level: str = "WARNING"
    # Meshfront's frontend: the split mesh (a process per stage) or the all-in-one gateway (one process, as
    # Dynamo's frontend is). Its rows are labelled with the frontend when it is the all-in-one.
    allinone: bool = False
    # py-spy on Meshfront's processes during each measured load (bench/profile.py): where the CPU per request goes.
    profile_dir: str = ""


class MixedPrompts(PromptFactory):
    """Long prompts mixed with short chats, each of its own random words (no accidental shared blocks)."""

    def __init__(self, cfg: DisaggBenchConfig, seed: int):
        super().__init__(cfg.short_min, seed=seed)
        self.cfg = cfg
        self._rng = random.Random(seed)

    def next_prompt(self) -> str:
        c, rng = self.cfg, self._rng
        long = rng.random() < c.long_share
        words = rng.randint(c.long_min, c.long_max) if long else rng.randint(c.short_min, c.short_max)
        return " ".join(rng.choices(WORDS, k=words))


def long_context_model(model_dir: Path) -> Path:
    """A copy of the demo model whose config allows ``CONTEXT`` tokens (the weights are not needed: mockers)."""
    out = ROOT / ".run" / "bench" / f"demo-qwen-{CONTEXT}"
    if not (out / "config.json").is_file():
        shutil.copytree(model_dir, out, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
        config = json.loads((out / "config.json").read_text())
        config["max_position_embeddings"] = CONTEXT
        (out / "config.json").write_text(json.dumps(config, indent=1))
    return out


def start(cfg: DisaggBenchConfig, shape: str, model_dir: str, log_dir: Path) -> Mesh:
    if shape.startswith("dynamo"):
        from bench import dynamo_peer

        modes = disaggregation_modes(cfg.workers, shape == "dynamo-disagg")
        return dynamo_peer.start(log_dir, model_dir, cfg.model_name, cfg.workers, cfg.speedup, "kv",
                                 disaggregation_modes=modes, mocker_flags=DYNAMO_MOCKER_FLAGS)
    mesh = Mesh(mesh_plan(cfg, shape, model_dir), log_dir)
    try:
        mesh.start(timeout=120)
    except BaseException:
        mesh.stop()
        raise
    return mesh


def mesh_plan(cfg: DisaggBenchConfig, shape: str, model_dir: str) -> MeshPlan:
    """Meshfront's mesh for one of its shapes: split, or the all-in-one gateway with ``cfg.allinone``."""
    return ephemeral_plan(worker_specs(cfg, shape, model_dir), router_mode="kv", run_dir=ROOT / ".run" / "bench",
                          log_level=cfg.log_level, inproc=cfg.allinone)


def worker_specs(cfg: DisaggBenchConfig, shape: str, model_dir: str) -> list[WorkerSpec]:
    """Our mockers in a Meshfront shape, in ``disaggregation_modes`` order."""
    overlap = ("--kv-transfer-overlap",) if shape == "disagg-overlap" else ()
    return [WorkerSpec(model_dir, cfg.model_name, "mocker", (*mocker_args(cfg, mode), *overlap))
            for mode in disaggregation_modes(cfg.workers, shape in DISAGGREGATED)]


def mocker_args(cfg: DisaggBenchConfig, mode: str) -> tuple[str, ...]:
    """Our mocker's flags in a Meshfront shape: the bench's pace and Dynamo's step times (``DYNAMO_PREFILL_MS``)."""
    timing = (x for flag, ms in DYNAMO_PREFILL_MS.items() for x in (flag, repr(ms)))
    return ("--speedup-ratio", f"{cfg.speedup:g}", *timing, "--disaggregation-mode", mode)


def disaggregation_modes(workers: int, disaggregated: bool) -> list[str]:
    """Each worker's ``--disaggregation-mode``: all agg, or one prefill and the rest decode."""
    if not disaggregated:
        return ["agg"] * workers
    if workers < 2:
        raise ValueError("a disaggregated shape needs at least 2 workers (1 prefill + 1 decode)")
    return ["prefill"] + ["decode"] * (workers - 1)


@dataclasses.dataclass
class ShapeResult:
    shape: str
    ok: int
    sent: int
    wall_s: float
    req_per_s: float
    tokens_per_s: float
    ttft_ms: dict[int, float]
    itl_ms: dict[int, float]
    frontend_cpu_ms_per_req: float
    workers_cpu_ms_per_req: float  # the mockers' own CPU: ours are Python, Dynamo's Rust, on the same cores
    handover_ms: float  # median gap from a stream's first token to its second (see handover_split)
    later_itl_p99_ms: float  # per-token ITL p99 without that first gap
    decode_cached_share: float | None  # None: not measured (Dynamo)
    errors: list[str]
    load: LoadResult | None = dataclasses.field(default=None, repr=False)  # the raw results, for pooling


def handover_split(load: LoadResult) -> tuple[float, float]:
    """(median first-to-second token gap, per-token ITL p99 of the gaps after it), in ms. Meshfront streams the
    prefill leg's first token at once, so its handover to the decode worker (the pull, the modelled transfer, the
    decode worker's next step) is the first gap; Dynamo's first token comes from its decode worker, after the
    handover, so it is in Dynamo's TTFT. Both ways of counting it are shown."""
    first: list[float] = []
    later: list[float] = []
    for r in load.results:
        if r.ok and len(r.arrivals) > 1:
            first.append((r.arrivals[1][0] - r.arrivals[0][0]) * 1000)
            later += [g * 1000 for g in dataclasses.replace(r, arrivals=r.arrivals[1:]).itl_gaps()[1]]
    return percentile(first, 50), percentile(later, 99)


def cache_counters(ports: list[int]) -> tuple[float, float]:
    """(prompt tokens, cached prompt tokens) the workers on ``ports`` counted so far."""
    prompt = cached = 0.0
    for port in ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "meshfront_worker_prompt_tokens_total":
                    prompt += sample.value
                elif sample.name == "meshfront_worker_cached_prompt_tokens_total":
                    cached += sample.value
    return prompt, cached


async def measure(url: str, pids: dict[str, int], cfg: DisaggBenchConfig, shape: str, seed: int,
                  emit: Printer, decode_ports: list[int], profiler: Profiler | None = None) -> ShapeResult:
    warm = LoadSpec(url=url, model=cfg.model_name, concurrency=min(4, cfg.warmup), requests=cfg.warmup,
                    max_tokens=cfg.max_tokens, duration_s=cfg.level_timeout_s)
    warmed = summarize(await run_load(warm, MixedPrompts(cfg, seed ^ 0xA11)))
    emit(f"[{shape}] warm-up: {warmed.ok}/{warmed.sent} ok" + (f"; {warmed.first_errors}" if warmed.errors else ""))
    spec = LoadSpec(url=url, model=cfg.model_name, concurrency=cfg.concurrency, requests=cfg.requests,
                    max_tokens=cfg.max_tokens, duration_s=cfg.level_timeout_s, request_timeout_s=cfg.level_timeout_s)
    conns = await open_connections(url, cfg.concurrency)
    counted = cache_counters(decode_ports)
    before = cpu.sample(pids)
    if profiler is not None:
        profiler.start(shape)
    load = await run_load(spec, MixedPrompts(cfg, seed), conns)  # the same prompts for every shape
    usage = cpu.usage_between(before, cpu.sample(pids))
    if profiler is not None:
        emit(profile_report(shape, profiler.stop()))
    prompt, cached = (after - was for after, was in zip(cache_counters(decode_ports), counted, strict=True))
    for c in conns:
        c.close()
    stats = summarize(load)
    handover, later_itl = handover_split(load)
    per_request = usage.per_request(stats.ok)
    emit(f"[{shape}] CPU ms/req: " + ", ".join(f"{g} {ms:.1f}" for g, ms in sorted(per_request.items())))
    frontend = sum(ms for group, ms in per_request.items() if group not in (*FRONTEND_EXCLUDES, "total"))
    share = cached / prompt if decode_ports and prompt else None
    label = f"{shape} (all-in-one)" if cfg.allinone and not shape.startswith("dynamo") else shape
    return ShapeResult(label, stats.ok, stats.sent, stats.wall_s, stats.req_per_s, stats.tokens_per_s, stats.ttft_ms,
                       stats.itl_ms, frontend, per_request["workers"], handover, later_itl, share, stats.first_errors,
                       load)


def run_shape(cfg: DisaggBenchConfig, shape: str, seed: int, emit: Printer) -> ShapeResult:
    from services.models.build import build_demo_model

    model_dir = str(long_context_model(build_demo_model(ROOT / "build" / "models" / "demo-qwen")))
    log_dir = ROOT / ".run" / "bench" / f"logs-{shape}-{time.strftime('%Y%m%d-%H%M%S')}"
    emit(f"[{shape}] starting (logs in {log_dir})")
    mesh = start(cfg, shape, model_dir, log_dir)
    try:
        pids = {name: p.pid for name, p in mesh.procs.items()}
        # Meshfront's decode (or whole-request) workers: the plan names them mocker-0.. in WorkerSpec order.
        modes = disaggregation_modes(cfg.workers, shape in DISAGGREGATED)
        decode_ports = [] if shape.startswith("dynamo") else [
            mesh.plan.metrics_ports[f"mocker-{i}"] for i, mode in enumerate(modes) if mode != "prefill"]
        profiler = None
        if cfg.profile_dir and not shape.startswith("dynamo"):
            profiler = Profiler(Path(cfg.profile_dir), pids, PROFILED)
        result = run_async(measure(mesh.url, pids, cfg, shape, seed, emit, decode_ports, profiler))
        emit(f"[{shape}] {line(result)}")
        return result
    except BaseException:
        emit(f"[{shape}] failed; last log lines:\n{mesh.all_logs()}")
        raise
    finally:
        mesh.stop()


def line(r: ShapeResult) -> str:
    return (f"{r.ok}/{r.sent} ok in {r.wall_s:.1f}s: TTFT p50 {r.ttft_ms[50]:.0f} p99 {r.ttft_ms[99]:.0f} ms, "
            f"ITL p50 {r.itl_ms[50]:.1f} p99 {r.itl_ms[99]:.1f} ms (first-to-second token p50 {r.handover_ms:.1f}, "
            f"ITL p99 after it {r.later_itl_p99_ms:.1f}), {r.req_per_s:.2f} req/s, {r.tokens_per_s:.0f} "
            f"tok/s, frontend CPU {r.frontend_cpu_ms_per_req:.1f} ms/req, workers' CPU {r.workers_cpu_ms_per_req:.1f} "
            f"ms/req, decode workers' prompt cached "
            f"{_share(r.decode_cached_share)}" + (f"; errors {r.errors}" if r.errors else ""))


def _share(share: float | None) -> str:
    return "-" if share is None else f"{share:.1%}"


def table(results: list[ShapeResult]) -> str:
    head = ("| shape | ok | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | 1st-2nd token p50 ms "
            "| ITL p99 after 2nd token ms | req/s | tok/s | frontend CPU ms/req | workers' CPU ms/req "
            "| decode workers' prompt cached |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = [f"| {r.shape} | {r.ok}/{r.sent} | {r.ttft_ms[50]:.0f} | {r.ttft_ms[99]:.0f} | {r.itl_ms[50]:.1f} | "
            f"{r.itl_ms[99]:.1f} | {r.handover_ms:.1f} | {r.later_itl_p99_ms:.1f} | {r.req_per_s:.2f} | "
            f"{r.tokens_per_s:.0f} | {r.frontend_cpu_ms_per_req:.1f} | "
            f"{r.workers_cpu_ms_per_req:.1f} | "
            f"{_share(r.decode_cached_share)} |" for r in results]
    return "\n".join([head, *rows])


def pooled(runs: list[ShapeResult]) -> ShapeResult:
    """One shape's runs (one per seed) as one: percentiles over every request of every run, throughput as
    requests over the runs' summed wall time, CPU per request weighted by each run's requests."""
    loads = [r.load for r in runs if r.load is not None]
    first = loads[0]
    wall = sum(load.wall_s for load in loads)
    merged = LoadResult(first.spec, 0.0, wall, [x for load in loads for x in load.results],
                        any(load.timed_out for load in loads))
    stats = summarize(merged)
    handover, later_itl = handover_split(merged)
    ok = sum(r.ok for r in runs) or 1
    shares = [r.decode_cached_share for r in runs if r.decode_cached_share is not None]
    return ShapeResult(f"{runs[0].shape}, {len(runs)} seeds pooled", stats.ok, stats.sent, stats.wall_s,
                       stats.req_per_s, stats.tokens_per_s, stats.ttft_ms, stats.itl_ms,
                       sum(r.frontend_cpu_ms_per_req * r.ok for r in runs) / ok,
                       sum(r.workers_cpu_ms_per_req * r.ok for r in runs) / ok, handover, later_itl,
                       sum(shares) / len(shares) if shares else None, stats.first_errors, merged)


def main_disagg(cfg: DisaggBenchConfig, emit: Printer) -> str:
    seeds = cfg.seeds or (cfg.seed if cfg.seed is not None else random.randrange(1 << 30),)
    emit(f"# seeds {', '.join(map(str, seeds))}; {TIMING_MODEL}")
    by_seed = []
    for seed in seeds:
        results = [run_shape(cfg, shape, seed, emit) for shape in cfg.shapes]
        by_seed.append(results)
        if len(seeds) > 1:
            emit(f"\nseed {seed}:\n{table(results)}")
    out = f"Timing model: {TIMING_MODEL}.\n\n"
    if len(seeds) == 1:
        return out + table(by_seed[0])
    tables = "\n\n".join(f"Seed {seed}:\n\n{table(results)}" for seed, results in zip(seeds, by_seed, strict=True))
    pools = [pooled([results[i] for results in by_seed]) for i in range(len(cfg.shapes))]
    return out + f"{tables}\n\nPooled over seeds {', '.join(map(str, seeds))}:\n\n{table(pools)}"
