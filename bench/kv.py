"""The ``kv`` scenario: KV-aware routing against round-robin and least-loaded on prefix-sharing load.

``python -m bench kv`` starts a fresh mesh per case (4 paced mocker workers with a small KV cache, the
router's Prometheus port open), drives one closed-loop level and reports TTFT p50/p99,
throughput, the cached-prompt share (sum of usage.cached_tokens / sum of prompt tokens) next to its
ceiling, the router's own predicted hit rate, and the largest worker share of routed prompt tokens.

Cases: ``groups`` (16 prefix groups, 80 % of each prompt shared inside its group) for every router
mode; ``flood`` (one hot prefix for every request); ``unique`` (nothing shared); ``replicas`` (the
groups workload through two kv router replicas, the gateway spreading calls over both; split shape only);
``mixed`` (prefill-heavy: a quarter of the prompts ~4,000 tokens, the rest ~200, nothing shared, 48 clients
against 4 workers) under kv routing with the router holding the excess in its queue, by request count
(``--max-in-flight-per-worker``) or by Dynamo's prefill-token load (``--router-queue-threshold``, and
``--active-prefill-tokens-threshold-frac``), with no threshold as the reference; the table adds the TTFT p50
of the short requests (split shape only: the thresholds are router flags).

``--shape split,inproc`` runs every case in each shape: ``split`` (a router process) and ``inproc``
(the all-in-one process, services/allinone, whose in-process router is built from the same router
flags: in kv mode it indexes the workers' KV events too, and its metrics are on that process's port).

The ceiling is exact for the prompts sent: each prompt is rendered and tokenized as the
preprocessor does, and a request can at best reuse the full blocks it shares with any earlier
request (an infinite cache and an oracle router).
"""

from __future__ import annotations

import dataclasses
import random
import re
import time
import urllib.request
from collections.abc import Callable

import orjson

from bench.loadgen import LoadSpec, run_load
from bench.mesh import run_async
from bench.prompts import WORDS
from bench.stats import summarize
from services.launcher.plan import ROOT, ProcessSpec, WorkerSpec, ephemeral_plan, free_port, specs
from services.launcher.processes import Mesh, wait_port

Printer = Callable[[str], None]
BLOCK = 16


@dataclasses.dataclass(frozen=True)
class KvBenchConfig:
    workers: int = 4
    num_gpu_blocks: int = 512
    speedup: float = 1.0
    prompt_tokens: int = 1000
    groups: int = 16
    shared_fraction: float = 0.8
    concurrency: int = 16
    requests: int = 480
    max_tokens: int = 24
    model_name: str = "meshfront/demo-qwen"
    seed: int = 11
    timeout_s: float = 180.0
    shapes: tuple[str, ...] = ("split",)


SHAPES = ("split", "inproc")


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    router_mode: str
    groups: int
    shared_fraction: float
    replicas: int = 1
    shape: str = "split"
    router_flags: tuple[str, ...] = ()  # extra router flags (the mixed cases' thresholds)
    mixed: bool = False  # MixedPrompts instead of GroupedPrompts


def cases(cfg: KvBenchConfig, names: tuple[str, ...]) -> list[Case]:
    """Every named case in every shape of ``cfg`` (replicas: split only, the router replicas being processes)."""
    out = []
    for shape in cfg.shapes:
        for c in _cases(cfg, names):
            if shape == "split":
                out.append(c)
            elif c.replicas == 1 and not c.mixed:
                out.append(dataclasses.replace(c, name=f"{c.name} [{shape}]", shape=shape))
    return out


def _cases(cfg: KvBenchConfig, names: tuple[str, ...]) -> list[Case]:
    all_cases = {
        "groups": [Case(f"groups/{m}", m, cfg.groups, cfg.shared_fraction) for m in ("round-robin", "least-loaded",
                                                                                   "kv")],
        "flood": [Case("flood/round-robin", "round-robin", 1, cfg.shared_fraction),
                  Case("flood/kv", "kv", 1, cfg.shared_fraction)],
        "unique": [Case("unique/round-robin", "round-robin", cfg.groups, 0.0),
                   Case("unique/kv", "kv", cfg.groups, 0.0)],
        "replicas": [Case("groups/kv x2 replicas", "kv", cfg.groups, cfg.shared_fraction, replicas=2)],
        "mixed": [Case(f"mixed/{name}", "kv", 0, 0.0, router_flags=flags, mixed=True)
                  for name, flags in MIXED_CASES],
    }
    return [c for n in names for c in all_cases[n]]


# The mixed cases' router flags. Every worker takes max_num_batched_tokens 8192 (the mocker's default); a
# 4,000-token prompt is half of that. Counting requests must pick one number for both sizes: 3 in flight per
# worker (12 of the 48 clients admitted). The prefill load threshold queues once every worker has more than
# 0.5 x 8192 tokens still to prefill, and a worker past 1.0 x 8192 is busy to new requests.
_WAIT = ("--queue-timeout-s", "120")
MIXED_CASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("no threshold", ()),
    ("in-flight 3", ("--max-in-flight-per-worker", "3", *_WAIT)),
    ("prefill tokens 0.5", ("--router-queue-threshold", "0.5", "--active-prefill-tokens-threshold-frac", "1.0",
                            *_WAIT)),
)
MIXED_LONG, MIXED_SHORT, MIXED_LONG_SHARE, MIXED_CONCURRENCY = 4000, 200, 0.25, 48


class MixedPrompts:
    """Unique prompts: ``long_share`` of them ``long`` words, the rest ``short`` (a prefill-heavy mix)."""

    def __init__(self, long: int, short: int, long_share: float, seed: int):
        self._sizes = (long, short)
        self._share = long_share
        self._rng = random.Random(seed)
        self.sent: list[str] = []

    def next_prompt(self) -> str:
        size = self._sizes[0] if self._rng.random() < self._share else self._sizes[1]
        prompt = " ".join(self._rng.choices(WORDS, k=size))
        self.sent.append(prompt)
        return prompt


class GroupedPrompts:
    """Prompts of ``prompt_tokens`` words: a group's shared prefix then a unique tail."""

    def __init__(self, prompt_tokens: int, groups: int, shared_fraction: float, seed: int):
        self.prompt_tokens = prompt_tokens
        self.shared = int(prompt_tokens * shared_fraction)
        rng = random.Random(seed)
        self._prefixes = [" ".join(rng.choices(WORDS, k=self.shared)) for _ in range(groups)]
        self._rng = random.Random(seed + 1)
        self.sent: list[str] = []

    def next_prompt(self) -> str:
        prefix = self._rng.choice(self._prefixes)
        tail = " ".join(self._rng.choices(WORDS, k=self.prompt_tokens - self.shared))
        prompt = f"{prefix} {tail}" if prefix else tail
        self.sent.append(prompt)
        return prompt


def ceiling(model_dir: str, prompts: list[str]) -> float:
    """Best possible cached share: full blocks each prompt shares with any earlier one."""
    from services.common.hashing import block_hashes, sequence_hashes
    from services.preprocessor.core.artifacts import load_artifacts
    from services.preprocessor.core.prompt import ChatInput, prepare_chat

    artifacts = load_artifacts(model_dir)
    seen: set[int] = set()
    cached = total = 0
    for p in prompts:
        ids = prepare_chat(artifacts, ChatInput(orjson.dumps([{"role": "user", "content": p}]).decode())).token_ids
        seq = sequence_hashes(block_hashes(ids, BLOCK))
        hit = next((i for i, h in enumerate(seq) if h not in seen), len(seq))
        cached += hit * BLOCK
        total += len(ids)
        seen.update(seq)
    return cached / total if total else 0.0


class KvBenchMesh(Mesh):
    """The launcher's mesh, plus metrics ports on the router(s) and optional extra replicas; in the
    all-in-one shape the router's metrics are on the all-in-one process's metrics port."""

    def __init__(self, plan, log_dir, replicas: int):
        super().__init__(plan, log_dir)
        self.replicas = replicas
        self.metrics_ports: list[int] = []

    def _specs(self) -> list[ProcessSpec]:
        if self.plan.inproc:
            self.metrics_ports = [self.plan.metrics_ports[f"gateway-{i}"] for i in range(len(self.plan.gateway_ports))]
            return specs(self.plan)
        out = []
        router_targets = []
        for spec in specs(self.plan):
            if spec.name == "router":
                for i in range(self.replicas):
                    port = spec.ready_port if i == 0 else free_port()
                    mport = free_port()
                    argv = [a if a != str(spec.ready_port) else str(port) for a in spec.argv]
                    out.append(ProcessSpec(f"router-{i}" if i else "router", [*argv, "--metrics-port", str(mport)],
                                           port, spec.env))
                    self.metrics_ports.append(mport)
                    router_targets.append(f"127.0.0.1:{port}")
                continue
            if spec.name.startswith("gateway") and self.replicas > 1:
                argv = list(spec.argv)
                argv[argv.index("--router") + 1] = "ipv4:" + ",".join(router_targets)
                spec = ProcessSpec(spec.name, argv, spec.ready_port, spec.env)
            out.append(spec)
        return out

    def start(self, timeout: float = 90.0) -> Mesh:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout
        for spec in self._specs():
            self.start_process(spec)
        for name, spec in self.specs.items():
            if not wait_port(spec.ready_port, deadline):
                raise RuntimeError(f"{name} did not open port {spec.ready_port}:\n{self.logs(name)}")
        self.wait_models(1, deadline)
        self.wait_healthy(deadline)  # warmed, as meshfront run is when it prints the URL
        return self


def scrape(ports: list[int]) -> dict[str, dict[str, float]]:
    """Sums of the router metrics we report, over every replica: name -> label -> value."""
    out: dict[str, dict[str, float]] = {}
    pattern = re.compile(r'^(meshfront_router_\w+?)(?:\{worker="([^"]*)"\})? ([0-9.e+-]+)$')
    for port in ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                m = pattern.match(line)
                if m:
                    d = out.setdefault(m.group(1), {})
                    d[m.group(2) or ""] = d.get(m.group(2) or "", 0.0) + float(m.group(3))
    return out


@dataclasses.dataclass
class CaseResult:
    case: Case
    ok: int
    errors: int
    ttft_p50: float
    ttft_p99: float
    req_per_s: float
    cached_share: float
    ceiling: float
    predicted_share: float
    max_worker_share: float
    first_errors: list[str]
    short_ttft_p50: float = float("nan")  # the mixed cases: requests of the short prompts alone


def run_case(cfg: KvBenchConfig, case: Case, model_dir: str, emit: Printer) -> CaseResult:
    extra = ("--speedup-ratio", f"{cfg.speedup:g}", "--num-gpu-blocks", str(cfg.num_gpu_blocks))
    workers = [WorkerSpec(model_dir, cfg.model_name, "mocker", extra) for _ in range(cfg.workers)]
    plan = ephemeral_plan(workers, router_mode=case.router_mode, run_dir=ROOT / ".run" / "bench", log_level="WARNING",
                          inproc=case.shape == "inproc", service_args={"router": case.router_flags})
    log_dir = ROOT / ".run" / "bench" / f"kv-{re.sub(r'[^a-z0-9]+', '-', case.name)}-{time.strftime('%H%M%S')}"
    mesh = KvBenchMesh(plan, log_dir, case.replicas)
    try:
        mesh.start()
        time.sleep(1.5)  # routers load every worker's (empty) KV state
        prompts: GroupedPrompts | MixedPrompts = (
            MixedPrompts(MIXED_LONG, MIXED_SHORT, MIXED_LONG_SHARE, cfg.seed) if case.mixed
            else GroupedPrompts(cfg.prompt_tokens, case.groups, case.shared_fraction, cfg.seed))
        concurrency = MIXED_CONCURRENCY if case.mixed else cfg.concurrency
        spec = LoadSpec(url=mesh.url, model=cfg.model_name, concurrency=concurrency, requests=cfg.requests,
                        max_tokens=cfg.max_tokens, duration_s=cfg.timeout_s, request_timeout_s=60.0)
        load = run_async(run_load(spec, prompts))
        time.sleep(0.5)  # let the last first-token reports reach the router
        metrics = scrape(mesh.metrics_ports)
    except BaseException:
        emit(f"[{case.name}] failed; logs:\n{mesh.all_logs()}")
        raise
    finally:
        mesh.stop()
    spills = metrics.get("meshfront_router_kv_spills_total", {}).get("")
    if spills is not None:
        emit(f"[{case.name}] kv decisions {metrics['meshfront_router_kv_decisions_total']['']:.0f}, "
             f"spills {spills:.0f}, hot-spot skips {metrics['meshfront_router_kv_hot_skips_total']['']:.0f}")
    return _result(case, load, metrics, 0.0 if case.mixed else ceiling(model_dir, prompts.sent))


def _result(case: Case, load, metrics: dict, ceil: float) -> CaseResult:
    stats = summarize(load)
    ok = [r for r in load.results if r.ok]
    prompt = sum(r.prompt_tokens for r in ok) or 1
    routed = metrics.get("meshfront_router_routed_prompt_tokens_total", {})
    reported = sum(metrics.get("meshfront_router_reported_prompt_tokens_total", {}).values()) or 1
    predicted = sum(metrics.get("meshfront_router_predicted_cached_tokens_total", {}).values())
    short = sorted(r.ttft * 1000 for r in ok if r.ttft is not None and r.prompt_tokens < MIXED_LONG // 2)
    return CaseResult(case, stats.ok, stats.errors, stats.ttft_ms[50], stats.ttft_ms[99], stats.req_per_s,
                      sum(r.cached_tokens for r in ok) / prompt, ceil, predicted / reported,
                      max(routed.values()) / (sum(routed.values()) or 1) if routed else float("nan"),
                      stats.first_errors, short[len(short) // 2] if short and case.mixed else float("nan"))


HEADER = ("| case | ok/err | TTFT p50 ms | TTFT p99 ms | short TTFT p50 ms | req/s | cached share | ceiling | "
          "predicted | max worker share |\n|---|---|---|---|---|---|---|---|---|---|")


def row(r: CaseResult) -> str:
    short = "—" if r.short_ttft_p50 != r.short_ttft_p50 else f"{r.short_ttft_p50:.0f}"  # NaN outside mixed
    return (f"| {r.case.name} | {r.ok}/{r.errors} | {r.ttft_p50:.0f} | {r.ttft_p99:.0f} | {short} | "
            f"{r.req_per_s:.1f} | {r.cached_share:.3f} | {r.ceiling:.3f} | {r.predicted_share:.3f} | "
            f"{r.max_worker_share:.3f} |")


def run(cfg: KvBenchConfig, names: tuple[str, ...], emit: Printer) -> list[CaseResult]:
    from services.models.build import build_demo_model

    model_dir = str(build_demo_model(ROOT / "build" / "models" / "demo-qwen"))
    results = []
    for case in cases(cfg, names):
        concurrency = MIXED_CONCURRENCY if case.mixed else cfg.concurrency
        emit(f"[{case.name}] running {cfg.requests} requests at c={concurrency} ...")
        r = run_case(cfg, case, model_dir, emit)
        emit(row(r) + (f" errors: {r.first_errors}" if r.errors else ""))
        results.append(r)
    return results


def main_kv(argv_cfg: KvBenchConfig, names: tuple[str, ...], emit: Printer) -> str:
    """Runs the cases and returns the markdown table."""
    results = run(argv_cfg, names, emit)
    return HEADER + "\n" + "\n".join(row(r) for r in results)

