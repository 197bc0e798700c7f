"""``python -m bench scale``: each stateless stage at 1, 2 and 4 replicas, each replica a small host.

Per row a fresh mesh is laid out on a private network (bench/scale_hosts.py, bench/netns.py):
the replicas of the stage under test each get a network namespace of their own and a cgroup with a
CPU quota (the host's size); everything else (NATS, mocker workers at a high speed-up, Envoy, one
process of every other stage) shares one unthrottled namespace, ``rest``, where the load generator
runs too. Quotas are set after the mesh has started and warmed (imports and tokenizer loading under a
0.015-core quota would take minutes), then a short settle load runs before the measured one.

Each row reports req/s (and per replica), the stage's CPU per request, TTFT, and which stage was the
bottleneck (bench/scale_report.py reads the quota's throttling counters and every process's CPU).
Streams and requests are per replica (``load_scale``). The ``router-kv`` case runs the router under
kv routing on prompts that share group prefixes and compares the cached share of 1 and 3 router
replicas, with the same load for both. Every load is bounded by a request count and
a time limit; namespaces, groups and processes are removed in ``finally`` (and SIGTERM is turned
into an exception so it reaches that ``finally``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence

from bench import cpu
from bench.loadgen import LoadSpec, open_connections, run_load
from bench.mesh import mux_counts, run_async
from bench.prompts import PromptFactory
from bench.scale_hosts import CpuHosts, cgroup_argv, inside_namespace
from bench.scale_report import ScaleRow, bottleneck, mux_cell, mux_per_request, process_group
from bench.stats import summarize
from services.launcher import envoy_config
from services.launcher.plan import ROOT, VENV_BIN, worker_argv

Printer = Callable[[str], None]
STAGES = ("gateway", "preprocessor", "router", "postprocessor", "allinone")
KV_CASE = "router-kv"
PORTS = {"gateway": 9100, "allinone": 9100, "preprocessor": 9200, "router": 9300, "postprocessor": 9400,
         "nats": 4222, "envoy": 8000, "admin": 9901, "mocker": 9500, "metrics": 9600}
MODULES = {"gateway": "services.gateway", "allinone": "services.allinone", "preprocessor": "services.preprocessor",
           "router": "services.router", "postprocessor": "services.postprocessor"}
# CPU cores per replica. Four replicas must fit next to an unthrottled rest that carries four times
# one replica's load, on a 2-core machine that other work shares. Measured here (32 tokens out, the
# machine loaded), CPU per request is about: gateway 6 ms, preprocessor 1.8 ms, router ~1 ms,
# postprocessor ~4 ms, all-in-one ~8 ms, the whole split mesh 13-20 ms. Each quota is sized so that
# four replicas carry about 35 req/s (gateway 4 x 0.05 / 6 ms), which asks the rest for about half a
# core: what the machine reliably spares. The period is the kernel's default, 100 ms, because 1 ms per
# period is the least a quota may be and the preprocessor's and router's are 1.5 ms.
QUOTAS = {"gateway": 0.05, "postprocessor": 0.05, "preprocessor": 0.015, "router": 0.015, "allinone": 0.08}


@dataclasses.dataclass(frozen=True)
class ScaleConfig:
    stages: tuple[str, ...] = (*STAGES, KV_CASE)
    replicas: tuple[int, ...] = (1, 2, 4)
    kv_replicas: tuple[int, ...] = (1, 3)
    quotas: tuple[tuple[str, float], ...] = tuple(QUOTAS.items())
    period_us: int = 100_000  # the kernel's default; 1 ms per period is the least a quota may be
    # Per replica, so every replica has the same queue and the window about the same length whatever N.
    concurrency: int = 16
    requests: int = 120  # the row also ends at level_timeout_s (requests still open then count as errors)
    level_timeout_s: float = 40.0
    settle_requests: int = 12  # after the quota is set, before the window
    warmup: int = 16
    prompt_tokens: int = 200
    max_tokens: int = 32
    workers: int = 2
    speedup: float = 100.0
    kv_groups: int = 16
    kv_shared_fraction: float = 0.8
    kv_gpu_blocks: int = 512
    model_name: str = "meshfront/demo-qwen"
    prefix: str = "10.214.0"  # the private subnet (tests/deploy/test_netns.py uses 10.213.0)
    log_level: str = "WARNING"
    seed: int = 7
    start_timeout_s: float = 120.0
    rounds: int = 1  # every row this many times; the report adds the medians (scale_report.medians)

    def quota(self, stage: str) -> float:
        return dict(self.quotas)[stage]


@dataclasses.dataclass(frozen=True)
class Proc:
    host: str  # "rest" or "r<i>" (a replica's host)
    name: str  # gateway-0, preprocessor-1, mocker-0, nats, envoy ...
    argv: list[str]
    port: int
    metrics_port: int = 0  # /metrics (0: none, e.g. NATS and Envoy): the bench scrapes the mux counters


def _target(addresses: Sequence[str], port: int) -> str:
    """One address, or every replica as a gRPC ``ipv4:`` list (round robin in the clients)."""
    addrs = [f"{a}:{port}" for a in addresses]
    return addrs[0] if len(addrs) == 1 else "ipv4:" + ",".join(addrs)


def topology(stage: str, replica_addrs: Sequence[str], rest: str, model_dir: str, cfg: ScaleConfig,
             run_dir: pathlib.Path, router_mode: str = "round-robin", worker_flags: Sequence[str] = ()) -> list[Proc]:
    """Every process of one row: the stage's replicas on hosts r0.., one of everything else on ``rest``."""
    nats = f"nats://{rest}:{PORTS['nats']}"
    common = ["--nats-url", nats, "--log-level", cfg.log_level]
    procs = [Proc("rest", "nats", [str(VENV_BIN / "nats-server"), "-js", "-a", rest, "-p", str(PORTS["nats"]),
                                   "-sd", str(run_dir / "nats")], PORTS["nats"])]
    metrics_ports = iter(range(PORTS["metrics"], PORTS["metrics"] + 100))  # distinct: the rest's share one address
    for i in range(cfg.workers):
        port, metrics = PORTS["mocker"] + i, next(metrics_ports)
        procs.append(Proc("rest", f"mocker-{i}", worker_argv(
            "mocker", "--host", rest, "--port", str(port), "--model-dir", model_dir, "--model-name", cfg.model_name,
            *common, "--metrics-port", str(metrics), "--speedup-ratio", f"{cfg.speedup:g}", *worker_flags), port,
            metrics))
    hosts = {s: [rest] for s in ("gateway", "preprocessor", "router", "postprocessor")}
    if stage != "allinone":
        hosts[stage] = list(replica_addrs)

    def service(s: str, i: int, address: str, *extra: str) -> Proc:
        host = "rest" if address == rest else f"r{list(replica_addrs).index(address)}"
        metrics = next(metrics_ports)
        return Proc(host, f"{s}-{i}", [sys.executable, "-m", MODULES[s], "--host", address, "--port",
                                       str(PORTS[s]), "--metrics-port", str(metrics), *common, *extra], PORTS[s],
                    metrics)

    router = _target(hosts["router"], PORTS["router"])
    if stage == "allinone":
        gateways = [service("allinone", i, a, "--router-mode", router_mode) for i, a in enumerate(replica_addrs)]
    else:
        procs += [service("preprocessor", i, a) for i, a in enumerate(hosts["preprocessor"])]
        procs += [service("router", i, a, "--router-mode", router_mode) for i, a in enumerate(hosts["router"])]
        procs += [service("postprocessor", i, a, "--router", router) for i, a in enumerate(hosts["postprocessor"])]
        stages = ["--preprocessor", _target(hosts["preprocessor"], PORTS["preprocessor"]), "--router", router,
                  "--postprocessor", _target(hosts["postprocessor"], PORTS["postprocessor"])]
        gateways = [service("gateway", i, a, *stages) for i, a in enumerate(hosts["gateway"])]
    procs += gateways
    envoy_yaml = run_dir / "envoy.yaml"
    envoy_yaml.write_text(envoy_config.render(
        listen_host=rest, listen_port=PORTS["envoy"], admin_host=rest, admin_port=PORTS["admin"],
        gateways=[(g.argv[g.argv.index("--host") + 1], PORTS["gateway"]) for g in gateways]))
    procs.append(Proc("rest", "envoy", [str(VENV_BIN / "envoy"), "-c", str(envoy_yaml), "--concurrency", "1",
                                        "--log-level", "warn", "--base-id", str(30000 + os.getpid() % 10000)],
                      PORTS["envoy"]))
    return procs


@contextlib.contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """SIGTERM raises SystemExit while the row runs, so its ``finally`` removes namespaces and groups."""
    def handler(signum, frame):
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def run(cfg: ScaleConfig, emit: Printer) -> list[ScaleRow]:
    from bench import netns

    netns.probe()  # raises NetnsUnavailable naming what was refused
    from services.models.build import build_demo_model

    model_dir = str(build_demo_model(ROOT / "build" / "models" / "demo-qwen"))
    rows = []
    for round_no in range(1, cfg.rounds + 1):
        for case in cfg.stages:
            counts = cfg.kv_replicas if case == KV_CASE else cfg.replicas
            # Every other round runs the replica counts backwards: a drift of the machine lands on both ends.
            for n in counts if round_no % 2 else tuple(reversed(counts)):
                row = dataclasses.replace(_one_row(cfg, case, n, model_dir, emit), round=round_no)
                rows.append(row)
    return rows


def _one_row(cfg: ScaleConfig, case: str, n: int, model_dir: str, emit: Printer) -> ScaleRow:
    stage = "router" if case == KV_CASE else case
    with sigterm_as_exit():
        row = run_row(cfg, case, stage, n, model_dir, emit)
    emit(f"[{case} x{n}] {row.req_per_s:.1f} req/s ({row.per_replica:.1f} per replica), {stage} CPU "
         f"{row.stage_cpu_ms:.2f} ms/req, total {row.total_cpu_ms:.2f}, TTFT p50 {row.ttft_p50_ms:.0f} ms, "
         f"mux msgs/req (chunks/msg) {mux_cell(row.mux)}, "
         f"{row.ok} ok / {row.errors} err"
         + (f" ({'; '.join(row.error_kinds)})" if row.error_kinds else "")
         + f", bg {row.bg_cores:.2f} cores"
         + ("" if row.cached_share is None else f", cached {100 * row.cached_share:.1f} %")
         + f"; bottleneck {row.verdict.bottleneck} ({row.verdict.evidence})")
    return row


def run_row(cfg: ScaleConfig, case: str, stage: str, replicas: int, model_dir: str, emit: Printer) -> ScaleRow:
    from bench import netns

    log_dir = ROOT / ".run" / "bench" / f"scale-{case}-x{replicas}-{time.strftime('%Y%m%d-%H%M%S')}"
    log_dir.mkdir(parents=True, exist_ok=True)
    kv = case == KV_CASE
    lab = netns.Lab(cfg.prefix)
    groups: CpuHosts | None = None
    try:
        groups = CpuHosts(period_us=cfg.period_us)
        rest = lab.add_host("rest", 10)
        # The rest's processes reach each other at its own address, which the kernel routes over loopback.
        subprocess.run(["ip", "-n", lab.namespace("rest"), "link", "set", "lo", "up"], check=True, timeout=10)
        addrs = [lab.add_host(f"r{i}", 20 + i) for i in range(replicas)]
        for i in range(replicas):
            groups.add(f"r{i}")
        procs = topology(stage, addrs, rest, model_dir, cfg, log_dir, router_mode="kv" if kv else "round-robin",
                         worker_flags=("--num-gpu-blocks", str(cfg.kv_gpu_blocks)) if kv else ())
        env = {"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
        pids = {}
        for p in procs:
            if p.host == "rest":
                pids[p.name] = lab.start(p.host, p.argv, log_dir / f"{p.name}.log", env).pid
            else:
                pids[p.name] = _start_limited(lab, groups, p, log_dir, env).pid
        emit(f"[{case} x{replicas}] {len(procs)} processes on {replicas + 1} hosts (logs in {log_dir})")
        with inside_namespace(lab.namespace("rest")):
            url = f"http://{rest}:{PORTS['envoy']}"
            _wait_ready(procs, lab, url, time.monotonic() + cfg.start_timeout_s, log_dir)
            metrics = [f"{lab.hosts[p.host]}:{p.metrics_port}" for p in procs if p.metrics_port]
            return run_async(_measure(cfg, case, stage, replicas, url, pids, groups, procs, kv, metrics))
    except BaseException:
        emit(f"[{case} x{replicas}] failed; last log lines:\n" + _tails(log_dir))
        raise
    finally:
        if groups is not None:
            groups.unlimit()
        stubborn = lab.stop_processes()
        lab.close()
        left = groups.close() if groups is not None else []
        if stubborn or left:
            emit(f"[{case} x{replicas}] teardown: killed {stubborn}, groups left {left}")


def _start_limited(lab, groups: CpuHosts, p: Proc, log_dir: pathlib.Path, env: dict[str, str]) -> subprocess.Popen:
    """Like ``Lab.start``, but the process joins its host's group first: ``ip netns exec`` mounts the
    namespace's own /sys, where the group's directory is not, so the group is joined outside it."""
    argv = cgroup_argv(groups.procs_file(p.host), ["ip", "netns", "exec", lab.namespace(p.host), *p.argv])
    with open(log_dir / f"{p.name}.log", "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env},
                                start_new_session=True)
    lab.procs.append(proc)  # stopped and waited for by the lab, as the rest's are
    return proc


def _tails(log_dir: pathlib.Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in sorted(log_dir.glob("*.log")))


def _wait_ready(procs: Sequence[Proc], lab, url: str, deadline: float, log_dir: pathlib.Path) -> None:
    """Every port answers, the model is listed and /health is 200 (the gateways warmed the workers)."""
    import socket

    for p in procs:
        address = lab.hosts[p.host]
        while True:
            with contextlib.suppress(OSError), socket.create_connection((address, p.port), timeout=0.5):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{p.name} did not open {address}:{p.port}")
            time.sleep(0.1)
    for path, ready in (("/v1/models", lambda b: bool(json.loads(b)["data"])), ("/health", lambda b: True)):
        while not _answers(url + path, ready):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url}{path} not ready in time")
            time.sleep(0.2)


def _answers(url: str, ready: Callable[[bytes], bool]) -> bool:
    """Whether GET ``url`` answers 200 with a body ``ready`` accepts."""
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return ready(r.read())
    except (OSError, ValueError, KeyError):
        return False


def load_scale(cfg: ScaleConfig, replicas: int, kv: bool) -> int:
    """How many replicas' worth of streams and requests a row sends: its own replica count, so every
    replica has the same queue; but kv rows all send the most kv replicas' worth, since the cached share
    depends on how many requests there are (each group's first misses) and how many run at once (two of
    a group in flight both miss)."""
    return max(cfg.kv_replicas) if kv else replicas


async def _measure(cfg: ScaleConfig, case: str, stage: str, replicas: int, url: str, pids: dict[str, int],
                   groups: CpuHosts, procs: Sequence[Proc], kv: bool, metrics: Sequence[str] = ()) -> ScaleRow:
    per = load_scale(cfg, replicas, kv)

    def spec(requests: int) -> LoadSpec:
        return LoadSpec(url=url, model=cfg.model_name, concurrency=min(cfg.concurrency * per, requests),
                        requests=requests,
                        max_tokens=cfg.max_tokens, duration_s=cfg.level_timeout_s,
                        request_timeout_s=cfg.level_timeout_s)

    warm = PromptFactory(cfg.prompt_tokens, seed=cfg.seed + 1)  # never the measured prompts (kv: same caches)
    if cfg.warmup:
        stats = summarize(await run_load(spec(cfg.warmup), warm))
        if not stats.ok:
            raise RuntimeError(f"warm-up failed: {stats.first_errors}")
    quota = cfg.quota(stage)
    for i in range(replicas):
        quota = groups.limit(f"r{i}", cfg.quota(stage))  # the kernel's minimum may round it up
    if cfg.settle_requests:
        await run_load(spec(cfg.settle_requests * per), warm)
    if kv:
        from bench.kv import GroupedPrompts

        prompts: PromptFactory | GroupedPrompts = GroupedPrompts(cfg.prompt_tokens, cfg.kv_groups,
                                                                 cfg.kv_shared_fraction, cfg.seed)
    else:
        prompts = PromptFactory(cfg.prompt_tokens, seed=cfg.seed)
    load_spec = spec(cfg.requests * per)
    conns = await open_connections(url, load_spec.concurrency)
    hosts = [f"r{i}" for i in range(replicas)]
    me = os.getpid()
    thr0 = [groups.throttling(h) for h in hosts]
    mux0 = mux_counts(metrics)
    cpu0, client0, machine0, t0 = cpu.sample(pids), cpu.read_threads_cpu_ms(me), cpu.read_machine_busy_ms(), \
        time.monotonic()
    load = await run_load(load_spec, prompts, conns)
    t1, cpu1, client1, machine1 = time.monotonic(), cpu.sample(pids), cpu.read_threads_cpu_ms(me), \
        cpu.read_machine_busy_ms()
    throttling = [groups.throttling(h).minus(before) for h, before in zip(hosts, thr0, strict=True)]
    mux1 = mux_counts(metrics)
    for c in conns:
        c.close()
    stats = summarize(load)
    usage = cpu.usage_between(cpu0, cpu1)
    window = t1 - t0
    group = "allinone" if stage == "allinone" else stage
    stage_ms = sum(ms for name, ms in usage.per_process_ms.items() if process_group(name) == group)
    others = {name: ms for name, ms in usage.per_process_ms.items() if process_group(name) != group}
    machine_cores = (machine1 - machine0) / 1000.0 / window
    client_ms = (client1 or 0.0) - (client0 or 0.0)
    others["client"] = client_ms
    verdict = bottleneck(stage, window, quota, stage_ms, throttling, others, machine_cores,
                         os.cpu_count() or 1)
    ok = max(1, stats.ok)
    bg = max(0.0, machine_cores - (usage.total_ms + client_ms) / 1000.0 / window)
    cached = stats.mean_cached_tokens / stats.mean_prompt_tokens if kv and stats.mean_prompt_tokens else None
    return ScaleRow(stage=stage, replicas=replicas, quota_cores=quota, ok=stats.ok, errors=stats.errors,
                    req_per_s=stats.req_per_s, stage_cpu_ms=stage_ms / ok, total_cpu_ms=usage.total_ms / ok,
                    ttft_p50_ms=stats.ttft_ms[50], ttft_p99_ms=stats.ttft_ms[99], verdict=verdict, bg_cores=bg,
                    cached_share=cached, label=case if case != stage else "",
                    mux=mux_per_request(mux0, mux1, stats.ok), error_kinds=tuple(stats.first_errors))
