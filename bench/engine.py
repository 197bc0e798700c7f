"""The ``engine`` scenario: vLLM (CPU build) behind Meshfront against vLLM's own OpenAI server.

Three deployments, each started fresh, warmed up (the warm-up requests are discarded), measured at
every concurrency level and stopped before the next one starts, all on the same model
(``default_test_model_dir(with_weights=True)``, a tiny random Qwen2), the same engine flags and the
same prompts (one prompt seed for the whole run):

- ``split``: Envoy -> gateway -> preprocessor / router / postprocessor -> ``vllm`` worker(s);
- ``inproc``: Envoy -> gateway (the three stages in-process) -> ``vllm`` worker(s);
- ``vllm``: ``python -m vllm.entrypoints.openai.api_server`` from ``.venv-vllm``;
- ``grpc`` and ``smg``: the all-in-one mesh and SMG 1.13 over ``vllm serve --grpc`` (bench/engine_grpc.py).

Every request streams a chat completion of exactly ``max_tokens`` tokens (``ignore_eos`` and
``min_tokens``). CPU is counted per completed request, per process, in four families:

- frontend: Envoy, gateway, preprocessor, router, postprocessor, NATS (the tier the goal is about);
- worker: the Meshfront vLLM worker process (gRPC server + vLLM's AsyncLLM client side);
- api-server: vLLM's own API server process (HTTP, chat template, tokenizer, detokenizer, AsyncLLM);
- engine: every process below a worker or the API server (vLLM's ``EngineCore`` and its workers),
  found from ``/proc`` (``bench.cpu.descendants``) before each level.

The goal under test: the frontend tier costs no more CPU per request than vLLM's API server
process on the same engine, with TTFT p50 within 10 % of the server's. ``goal_lines`` reports it
against the figures as measured.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import math
import os
import random
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import orjson

from bench import cpu
from bench.loadgen import LoadSpec, run_load
from bench.mesh import measured_load
from bench.prompts import ImagePromptFactory, PromptFactory
from bench.stats import LevelStats, summarize
from services.launcher.engine_env import ENGINES
from services.launcher.plan import ROOT, WorkerSpec, ephemeral_plan, free_port
from services.launcher.processes import Mesh
from services.launcher.run import VLLM_CPU_FLAGS

DEPLOYMENTS = ("split", "inproc", "vllm", "grpc", "smg")
# attach = meshfront attach (the grpc shape's registrar); smg = SMG's router; servicer = the process of a
# `vllm serve --grpc` engine (its gRPC servicer), counted to the frontend side (bench/engine_grpc.py).
FRONTEND = ("envoy", "gateway", "preprocessor", "router", "postprocessor", "nats", "attach", "smg", "servicer")
COLUMNS = (*FRONTEND, "frontend", "worker", "api-server", "fe-total", "engine")
SHORT = {"envoy": "envoy", "gateway": "gw", "preprocessor": "pre", "router": "route", "postprocessor": "post",
         "nats": "nats", "attach": "attach", "smg": "smg", "servicer": "servicer", "frontend": "FRONTEND",
         "worker": "worker", "api-server": "API-srv", "fe-total": "FE total", "engine": "engine"}
SERVER = "api-server"  # the process name of vLLM's own server
# Same engine flags for the workers and vLLM's server (the server's --model/--served-model-name are
# the worker's --model-dir/--model-name).
ENGINE_FLAGS = ("--max-model-len", "4096", *VLLM_CPU_FLAGS)
TTFT_TOLERANCE = 0.10

Printer = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class EngineBenchConfig:
    deployments: tuple[str, ...] = DEPLOYMENTS
    concurrency: tuple[int, ...] = (8, 32)
    requests: int | None = None  # per level; None = max(96, 4 * concurrency)
    prompt_tokens: int = 200
    max_tokens: int = 64
    warmup: int = 16  # requests per deployment, discarded
    workers: int = 1  # vLLM workers behind each mesh (vLLM's server is always one engine)
    level_timeout_s: float = 300.0  # a level's whole run; no request starts after it
    request_timeout_s: float = 180.0
    start_timeout_s: float = 480.0  # a deployment's start (vLLM's engine start dominates)
    model_name: str = "meshfront/demo-qwen"
    engine_flags: tuple[str, ...] = ENGINE_FLAGS
    log_level: str = "WARNING"
    seed: int | None = None  # prompt seed; None = one random seed for the run, shared by every deployment
    idle_s: float = 3.0  # idle-CPU window after warm-up; 0 skips it
    vision: bool = False  # the demo vision model, one distinct image per request (bench/prompts.py)

    def requests_for(self, concurrency: int) -> int:
        return self.requests if self.requests else max(96, 4 * concurrency)


@dataclasses.dataclass
class EngineRecord:
    deployment: str
    stats: LevelStats
    cpu_per_request: dict[str, float]  # column -> ms (FRONTEND groups, frontend, worker, api-server, engine, total)
    per_process_ms: dict[str, float]  # process name -> ms per request
    client_cpu_per_request: float
    window_cpu_ms: float
    bg_cores: float  # CPU other tenants used during the window, in cores
    loadavg: float
    idle_ms_per_s: dict[str, float] = dataclasses.field(default_factory=dict)

    def as_json(self) -> dict:
        return {"deployment": self.deployment, "stats": self.stats.as_dict(),
                "cpu_ms_per_request": self.cpu_per_request, "per_process_ms_per_request": self.per_process_ms,
                "client_cpu_ms_per_request": self.client_cpu_per_request, "window_cpu_ms": self.window_cpu_ms,
                "bg_cores": self.bg_cores, "loadavg": self.loadavg, "idle_ms_per_s": self.idle_ms_per_s}


# --- process naming and grouping (pure) ---------------------------------------------------------------


def child_name(parent: str, label: str, pid: int) -> str:
    """A descendant's process name: ``vllm-0/VLLM::EngineCore:1234``."""
    return f"{parent}/{label}:{pid}"


def engine_group(name: str) -> str:
    """Report column of a process name (the launcher's names, ``api-server``, or ``child_name``'s)."""
    if "/" in name:
        return "engine"
    if name == SERVER:
        return SERVER
    if name.startswith(tuple(ENGINES)):
        return "worker"
    for g in FRONTEND:
        if name.startswith(g):
            return g  # gateway-0 -> gateway, router-1 -> router
    return name


def columns(per_group: Mapping[str, float]) -> dict[str, float]:
    """Adds ``frontend`` (the sum of the frontend groups present) and ``fe-total`` (that plus our worker and vLLM's
    API server: everything outside the engine, issue 40 item 4's comparison) to a group -> value map."""
    out = dict(per_group)
    present = [per_group[g] for g in FRONTEND if g in per_group]
    if present:
        out["frontend"] = sum(present)
    outside = [per_group[g] for g in (*FRONTEND, "worker", SERVER) if g in per_group]
    if outside:
        out["fe-total"] = sum(outside)
    return out


def goal_verdict(frontend_ms: float, server_ms: float, ttft_ms: float, server_ttft_ms: float,
                 tolerance: float = TTFT_TOLERANCE) -> tuple[bool, bool]:
    """(frontend CPU/request <= the API server's, TTFT p50 within ``tolerance`` of the server's)."""
    cpu_ok = frontend_ms <= server_ms
    ttft_ok = server_ttft_ms > 0 and abs(ttft_ms / server_ttft_ms - 1.0) <= tolerance
    return cpu_ok, ttft_ok


def goal_lines(records: Iterable[EngineRecord]) -> list[str]:
    """One line per mesh deployment and level that has a vLLM-server level at the same concurrency."""
    recs = list(records)
    ref = {r.stats.concurrency: r for r in recs if r.deployment == "vllm"}
    out = []
    for r in recs:
        base = ref.get(r.stats.concurrency)
        if r.deployment == "vllm" or base is None:
            continue
        front, server = r.cpu_per_request.get("frontend", math.nan), base.cpu_per_request.get(SERVER, math.nan)
        ttft, base_ttft = r.stats.ttft_ms[50], base.stats.ttft_ms[50]
        cpu_ok, ttft_ok = goal_verdict(front, server, ttft, base_ttft)
        worker = r.cpu_per_request.get("worker", 0.0)
        failed = [f"{x.deployment} {x.stats.errors}/{x.stats.sent} failed ({'; '.join(x.stats.first_errors)})"
                  for x in (r, base) if x.stats.errors]
        out.append(
            f"c={r.stats.concurrency} {r.deployment}: frontend {front:.2f} vs vLLM API server {server:.2f} CPU ms/req "
            f"({front / server:.2f}x) -> {'MET' if cpu_ok else 'NOT MET'}; TTFT p50 {ttft:.0f} vs {base_ttft:.0f} ms "
            f"({ttft / base_ttft - 1:+.0%}) -> {'MET' if ttft_ok else 'NOT MET'} (±{TTFT_TOLERANCE:.0%}); "
            f"frontend + worker process {front + worker:.2f} ms/req; engine {r.cpu_per_request.get('engine', 0):.2f} "
            f"vs {base.cpu_per_request.get('engine', 0):.2f} ms/req; req/s {r.stats.req_per_s:.1f} vs "
            f"{base.stats.req_per_s:.1f}"
            + (f"; NOT COMPARABLE: {', '.join(failed)}" if failed else ""))
    return out


# --- report ------------------------------------------------------------------------------------------

HEADERS = (["deploy", "conc", "req/s", "TTFT p50", "p99", "ITL p50", "p99", "out tok"] + [SHORT[c] for c in COLUMNS]
           + ["total", "client", "ok/err"])


def _num(v: float | None, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return f"{v:.{digits}f}"


def cells(r: EngineRecord) -> list[str]:
    s = r.stats
    return ([r.deployment, str(s.concurrency), _num(s.req_per_s), _num(s.ttft_ms[50]), _num(s.ttft_ms[99]),
             _num(s.itl_ms[50], 2), _num(s.itl_ms[99], 2), _num(s.mean_completion_tokens)]
            + [_num(r.cpu_per_request.get(c), 2) for c in COLUMNS]
            + [_num(r.cpu_per_request.get("total"), 2), _num(r.client_cpu_per_request, 2), f"{s.ok}/{s.errors}"])


def text_table(records: list[EngineRecord]) -> str:
    grid = [HEADERS] + [cells(r) for r in records]
    widths = [max(len(line[i]) for line in grid) for i in range(len(HEADERS))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in grid)


def markdown_table(records: list[EngineRecord]) -> str:
    out = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    return "\n".join(out + ["| " + " | ".join(cells(r)) + " |" for r in records])


LEGEND = ("Latencies in ms (TTFT from request write to first content, ITL per token); out tok = mean completion "
          "tokens per request. CPU columns are CPU-ms per completed request (thread schedstat sums per process): "
          "envoy..servicer are the frontend processes and FRONTEND their sum (attach = meshfront attach, smg = "
          "SMG's router, servicer = the `vllm serve --grpc` engine's own process: its gRPC servicer and AsyncLLM "
          "client); worker = the Meshfront vLLM worker process (gRPC + AsyncLLM client); API-srv = vLLM's own API "
          "server process; FE total = everything but the engine; engine = every process below the worker, the "
          "API server or the servicer (EngineCore and its workers; it busy-waits under load, so it "
          "takes whatever CPU is left). total = all of them; client = the load generator (not in total). "
          "`—` = no such process in this deployment.")


# --- deployments -------------------------------------------------------------------------------------


def _engine_python() -> Path:
    env = ENGINES["vllm"]
    if not env.python.exists():
        raise RuntimeError(f"{env.venv} is missing: run `.venv/bin/python -m services.launcher.engine_env vllm`")
    return env.python


def _model_dir(vision: bool = False) -> str:
    if vision:
        from services.models.qwen_vl import default_vision_model_dir

        return str(default_vision_model_dir(with_weights=True))
    from services.models.build import default_test_model_dir

    return str(default_test_model_dir(with_weights=True))


def _alive(pid: int, start: bytes) -> bool:
    fields = cpu._stat_fields(pid)
    return fields is not None and fields[19] == start and fields[0] != b"Z"


class Tracked:
    """Descendants seen below the deployment's roots, so none outlives the deployment's stop."""

    def __init__(self) -> None:
        self.seen: dict[int, bytes] = {}  # pid -> start time (field 22 of /proc/<pid>/stat)

    def expand(self, roots: Mapping[str, int]) -> dict[str, int]:
        """``roots`` plus every descendant of each, named with ``child_name``."""
        parents = cpu.parent_table()
        out = dict(roots)
        for name, pid in roots.items():
            for child in cpu.descendants(pid, parents):
                label = cpu.process_label(child)
                fields = cpu._stat_fields(child)
                if label is None or fields is None:
                    continue
                self.seen.setdefault(child, fields[19])
                out[child_name(name, label, child)] = child
        return out

    def reap(self, grace_s: float = 5.0) -> list[str]:
        """SIGKILLs any tracked descendant (the very process seen, by start time) still alive after
        ``grace_s`` (multiprocessing's resource tracker exits a moment after its last user)."""
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_alive(p, s) for p, s in self.seen.items()):
            time.sleep(0.1)
        left = []
        for pid, start in self.seen.items():
            if _alive(pid, start):
                left.append(f"{cpu.process_label(pid)}:{pid} outlived its parent (killed)")
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        return left


class Deployment:
    """A running deployment: its URL, the processes to account and how to stop it."""

    name: str
    url: str
    pids: dict[str, int]  # top-level processes (their descendants are found per level)
    roots: dict[str, int]  # processes whose descendants are the engine

    def check(self) -> None:
        raise NotImplementedError

    def logs(self) -> str:
        raise NotImplementedError

    def stop(self) -> list[str]:
        raise NotImplementedError


class MeshDeployment(Deployment):
    def __init__(self, cfg: EngineBenchConfig, shape: str, model_dir: str, log_dir: Path, tracked: Tracked,
                 workers: list[WorkerSpec] | None = None):
        """``workers``: in place of ``cfg.workers`` vLLM workers (the grpc shape's registrar)."""
        if workers is None:
            workers = [WorkerSpec(model_dir, cfg.model_name, "vllm", cfg.engine_flags) for _ in range(cfg.workers)]
        plan = ephemeral_plan(workers, inproc=shape == "inproc", router_mode="round-robin",
                              run_dir=ROOT / ".run" / "bench", log_level=cfg.log_level)
        self.name, self.tracked = shape, tracked
        self.mesh = Mesh(plan, log_dir)
        self.mesh.start(timeout=cfg.start_timeout_s)  # stops what it started (and prints logs) on failure
        self.url = self.mesh.url
        self.pids = {n: p.pid for n, p in self.mesh.procs.items()}
        self.roots = {n: pid for n, pid in self.pids.items() if engine_group(n) == "worker"}

    def check(self) -> None:
        dead = {n: p.returncode for n, p in self.mesh.procs.items() if p.poll() is not None}
        if dead:
            raise RuntimeError(f"mesh processes exited: {dead}")

    def logs(self) -> str:
        return self.mesh.all_logs()

    def stop(self) -> list[str]:
        self.tracked.expand(self.roots)
        return self.mesh.stop(grace=30.0) + self.tracked.reap()


class ServerDeployment(Deployment):
    """``python -m vllm.entrypoints.openai.api_server`` from the engine environment."""

    def __init__(self, cfg: EngineBenchConfig, model_dir: str, log_dir: Path, tracked: Tracked):
        self.name, self.tracked = "vllm", tracked
        port = free_port()
        self.argv = [str(_engine_python()), "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
                     "--served-model-name", cfg.model_name, *cfg.engine_flags, "--port", str(port),
                     "--host", "127.0.0.1"]
        self.url = f"http://127.0.0.1:{port}"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / "vllm-server.log"
        with self.log_path.open("ab") as log:
            env = {**os.environ, "VLLM_HOST_IP": "127.0.0.1", "PYTHONUNBUFFERED": "1"}
            if cfg.vision:  # Qwen2-VL's processor without torchvision, as the worker loads it (its media.py)
                from services.workers.vllm.media import enable_pil_processors

                enable_pil_processors(env)
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        atexit.register(_kill_group, self.proc)
        self.pids = {SERVER: self.proc.pid}
        self.roots = dict(self.pids)
        try:
            self._wait_ready(cfg.model_name, time.monotonic() + cfg.start_timeout_s)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, model: str, deadline: float) -> None:
        while time.monotonic() < deadline:
            self.check()
            with contextlib.suppress(OSError, ValueError), \
                    urllib.request.urlopen(f"{self.url}/v1/models", timeout=1) as r:
                if any(m.get("id") == model for m in orjson.loads(r.read()).get("data", [])):
                    return
            time.sleep(0.5)
        raise RuntimeError(f"vLLM's server did not serve {model} in time:\n{self.logs()}")

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"vLLM's server exited with {self.proc.returncode}:\n{self.logs()}")

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""

    def stop(self, grace: float = 30.0) -> list[str]:
        self.tracked.expand(self.roots)
        problems = []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            problems.append("vLLM's server ignored SIGTERM")
            _kill_group(self.proc)
            self.proc.wait()
        return problems + self.tracked.reap()


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def start(cfg: EngineBenchConfig, name: str, model_dir: str, log_dir: Path, tracked: Tracked) -> Deployment:
    if name == "vllm":
        return ServerDeployment(cfg, model_dir, log_dir, tracked)
    if name in ("grpc", "smg"):
        from bench import engine_grpc

        shape = engine_grpc.GrpcMeshDeployment if name == "grpc" else engine_grpc.SmgDeployment
        return shape(cfg, model_dir, log_dir, tracked)
    return MeshDeployment(cfg, name, model_dir, log_dir, tracked)


# --- measuring ---------------------------------------------------------------------------------------


def _load_spec(cfg: EngineBenchConfig, url: str, concurrency: int, requests: int) -> LoadSpec:
    return LoadSpec(url=url, model=cfg.model_name, concurrency=concurrency, requests=requests,
                    max_tokens=cfg.max_tokens, duration_s=cfg.level_timeout_s,
                    request_timeout_s=min(cfg.request_timeout_s, cfg.level_timeout_s), ignore_eos=True,
                    min_tokens=cfg.max_tokens)


async def measure_level(dep: Deployment, cfg: EngineBenchConfig, concurrency: int, prompts: PromptFactory,
                        tracked: Tracked, emit: Printer) -> EngineRecord:
    pids = {**dep.pids, **tracked.expand(dep.roots)}
    spec = _load_spec(cfg, dep.url, concurrency, cfg.requests_for(concurrency))
    m = await measured_load(spec, prompts, pids, f"[{dep.name}] c={concurrency}", emit)
    n = max(1, m.stats.ok)
    return EngineRecord(dep.name, m.stats, columns(m.usage.per_request(m.stats.ok, engine_group)),
                        {p: ms / n for p, ms in m.usage.per_process_ms.items()}, m.client_ms / n, m.usage.total_ms,
                        m.bg_cores, os.getloadavg()[0])


async def idle_cpu_per_s(pids: dict[str, int], seconds: float) -> dict[str, float]:
    before = cpu.sample(pids)
    await asyncio.sleep(seconds)
    usage = cpu.usage_between(before, cpu.sample(pids))
    out = {g: ms / seconds for g, ms in columns(usage.by_group(engine_group)).items()}
    out["total"] = usage.total_ms / seconds
    return out


def _fmt(values: Mapping[str, float]) -> str:
    return ", ".join(f"{k} {v:.1f}" for k, v in values.items())


async def drive(dep: Deployment, cfg: EngineBenchConfig, seed: int, tracked: Tracked,
                emit: Printer) -> list[EngineRecord]:
    """Warm-up (discarded), an idle window, then one measured level per concurrency."""
    prompts = (ImagePromptFactory if cfg.vision else PromptFactory)(cfg.prompt_tokens, seed=seed)
    if cfg.warmup:
        warm = _load_spec(cfg, dep.url, min(cfg.warmup, max(cfg.concurrency)), cfg.warmup)
        s = summarize(await run_load(warm, prompts))
        emit(f"[{dep.name}] warm-up (discarded): {s.ok}/{s.sent} ok in {s.wall_s:.1f}s, TTFT p50 {s.ttft_ms[50]:.0f} "
             f"ms, {s.mean_completion_tokens:.0f} tokens out" + (f"; errors: {s.first_errors}" if s.errors else ""))
        if not s.ok:
            dep.check()
            raise RuntimeError(f"warm-up failed: {s.first_errors}")
    pids = {**dep.pids, **tracked.expand(dep.roots)}
    emit(f"[{dep.name}] processes: " + ", ".join(f"{n} ({p})" for n, p in pids.items()))
    idle = await idle_cpu_per_s(pids, cfg.idle_s) if cfg.idle_s > 0 else {}
    if idle:
        emit(f"[{dep.name}] idle CPU, ms per second: {_fmt(idle)}")
    records = []
    for c in cfg.concurrency:
        dep.check()
        rec = await measure_level(dep, cfg, c, prompts, tracked, emit)
        rec.idle_ms_per_s = idle
        s = rec.stats
        cols = {SHORT[k]: rec.cpu_per_request[k] for k in COLUMNS if k in rec.cpu_per_request}
        emit(f"[{dep.name}] c={c}: {s.ok}/{s.sent} ok in {s.wall_s:.1f}s, {s.req_per_s:.2f} req/s, TTFT p50 "
             f"{s.ttft_ms[50]:.0f} p99 {s.ttft_ms[99]:.0f} ms, ITL p50 {s.itl_ms[50]:.1f} ms, "
             f"{s.mean_completion_tokens:.1f} tokens out, prompt {s.mean_prompt_tokens:.0f} tok; CPU ms/req: "
             f"{_fmt(cols)}; total {rec.cpu_per_request['total']:.2f}; bg {rec.bg_cores:.2f} cores"
             + (f"; errors: {s.first_errors}" if s.errors else ""))
        engine_side = {p: ms for p, ms in rec.per_process_ms.items()
                       if engine_group(p) in ("worker", SERVER, "servicer", "engine")}
        emit(f"[{dep.name}] c={c}: per engine-side process, CPU ms/req: {_fmt(engine_side)}")
        if s.ok and abs(s.mean_completion_tokens - cfg.max_tokens) > 0.01:
            emit(f"[{dep.name}] c={c}: caveat: {s.mean_completion_tokens:.2f} tokens per request, not {cfg.max_tokens}")
        records.append(rec)
    dep.check()
    return records


def run_deployment(cfg: EngineBenchConfig, name: str, model_dir: str, seed: int, emit: Printer) -> list[EngineRecord]:
    from bench.mesh import run_async

    log_dir = ROOT / ".run" / "bench" / f"engine-{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    emit(f"[{name}] starting (logs in {log_dir})")
    tracked = Tracked()
    t0 = time.monotonic()
    dep = start(cfg, name, model_dir, log_dir, tracked)
    emit(f"[{name}] up at {dep.url} after {time.monotonic() - t0:.0f}s")
    try:
        return run_async(drive(dep, cfg, seed, tracked, emit))
    except BaseException:
        emit(f"[{name}] failed; last log lines:\n{dep.logs()}")
        raise
    finally:
        problems = dep.stop()
        if problems:
            emit(f"[{name}] teardown problems: {problems}")


def setting_line(cfg: EngineBenchConfig, seed: int) -> str:
    return (f"deployments {','.join(cfg.deployments)}; {cfg.workers} vLLM CPU worker(s) per mesh (round-robin), "
            f"vLLM's server = 1 engine; engine flags {' '.join(cfg.engine_flags)}; prompts ~{cfg.prompt_tokens} words "
            f"(+ chat template), {cfg.max_tokens} tokens out (ignore_eos, min_tokens); requests/level "
            f"{cfg.requests or 'max(96, 4*c)'}, warm-up {cfg.warmup} (discarded), level bound "
            f"{cfg.level_timeout_s:g}s, prompt seed {seed}")


def run(cfg: EngineBenchConfig, emit: Printer) -> tuple[list[EngineRecord], int]:
    _engine_python()
    if not ENGINES["vllm"].is_ready():
        emit("# warning: .venv-vllm's stamp does not match its inputs (`python -m services.launcher.engine_env vllm` "
             "would update it); running with it as it is")
    seed = cfg.seed if cfg.seed is not None else random.randrange(1 << 30)
    emit(f"# {setting_line(cfg, seed)}")
    model_dir = _model_dir(cfg.vision)
    records: list[EngineRecord] = []
    for name in cfg.deployments:
        records += run_deployment(cfg, name, model_dir, seed, emit)
    return records, seed
