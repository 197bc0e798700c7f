"""``python -m bench embeddings``: POST /v1/embeddings through the mesh vs the same model called in-process.

**mesh** rows: a fresh mesh per shape (NATS, one embedding worker with all-MiniLM-L6-v2, the stages,
Envoy), ``c`` closed-loop HTTP clients each sending one input per request over a keep-alive
connection (bench/http.py). Embeddings per second are completed requests per second; CPU is summed
over every mesh process (the load generator's own is not counted) and also shown for the worker alone.

**direct** rows: the same ``SentenceEmbedder`` in this process, no mesh, no HTTP: each step tokenizes
``c`` inputs and embeds them in one forward pass, which is what the worker's batcher achieves at
best when ``c`` requests are waiting. CPU is this process's own.

Inputs are short sentences (~20 words, ~25 tokens) drawn from a seeded vocabulary, so no two are
the same. The machine's busy time minus the mesh and the client gives ``bg cores``: how much other
tenants ran during a level.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from bench import cpu
from bench.http import Connection, HttpError
from services.launcher.plan import ROOT, WorkerSpec, ephemeral_plan
from services.launcher.processes import Mesh

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
SHAPES = ("split", "inproc")
WORDS = (  # noqa: SIM905 - a word list reads better as text
    "the quick brown fox jumps over a lazy dog while market prices rise and fall as rain moves across "
    "northern hills where music plays softly near old stone bridges built by careful hands long ago "
    "students read books about planets oceans history cooking bread gardens trains and distant cities "
).split()

Printer = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class EmbedBenchConfig:
    shapes: tuple[str, ...] = ("split",)
    concurrency: tuple[int, ...] = (1, 8, 32)
    requests: int | None = None  # per level; None = max(100, 8 * c)
    words: int = 20
    warmup: int = 16
    direct: bool = True
    seed: int = 7
    log_level: str = "WARNING"
    threads: int = 1  # torch threads of the worker and of the direct baseline alike

    def requests_for(self, c: int) -> int:
        return self.requests or max(100, 8 * c)


@dataclasses.dataclass(frozen=True)
class EmbedRow:
    setting: str  # "split", "inproc" or "direct"
    concurrency: int
    requests: int
    errors: int
    wall_s: float
    cpu_ms: float  # mesh processes (or this process, direct)
    worker_cpu_ms: float  # the embedding worker alone (direct: the same as cpu_ms)
    p50_ms: float
    p99_ms: float
    bg_cores: float
    inputs_per_pass: float = 0.0  # mean inputs per forward pass (the worker's batch histogram)

    @property
    def per_s(self) -> float:
        return (self.requests - self.errors) / self.wall_s if self.wall_s else 0.0

    def cpu_per_request(self, ms: float) -> float:
        return ms / max(1, self.requests - self.errors)


def sentences(n: int, words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"{i}: " + " ".join(rng.choice(WORDS) for _ in range(words)) for i in range(n)]


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def start_mesh(cfg: EmbedBenchConfig, shape: str, log_dir: Path) -> Mesh:
    from services.models.minilm import default_embedding_model_dir

    plan = ephemeral_plan([WorkerSpec(str(default_embedding_model_dir()), MODEL, "embed",
                                      ("--threads", str(cfg.threads)))],
                          inproc=shape == "inproc", run_dir=ROOT / ".run" / "bench", log_level=cfg.log_level)
    mesh = Mesh(plan, log_dir)
    mesh.start(timeout=120)
    return mesh


async def _post(conn: Connection, body: bytes) -> float:
    """Latency of one request in ms; raises HttpError on a non-200."""
    start = time.monotonic()
    payload = b"".join([p async for _, p in conn.post_stream("/v1/embeddings", body)])
    if b'"embedding"' not in payload:
        raise HttpError(f"no embedding in {payload[:200]!r}")
    return (time.monotonic() - start) * 1000


def _batch_histogram(mesh: Mesh) -> tuple[float, float]:
    """(forward passes, inputs) of the embedding worker so far, from its Prometheus histogram."""
    [name] = [n for n in mesh.plan.metrics_ports if n.startswith("embed-")]
    text = httpx.get(f"http://127.0.0.1:{mesh.plan.metrics_ports[name]}/metrics", timeout=5).text
    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    return (samples.get("meshfront_worker_embed_batch_inputs_count", 0.0),
            samples.get("meshfront_worker_embed_batch_inputs_sum", 0.0))


async def _mesh_level(mesh: Mesh, shape: str, c: int, bodies: list[bytes]) -> EmbedRow:
    conns = [Connection("127.0.0.1", mesh.plan.http_port) for _ in range(c)]
    await asyncio.gather(*(conn.connect() for conn in conns))
    pids = {name: proc.pid for name, proc in mesh.procs.items()}
    latencies: list[float] = []
    errors = 0
    todo = list(bodies)

    async def slot(conn: Connection) -> None:
        nonlocal errors
        while todo:
            body = todo.pop()
            try:
                latencies.append(await _post(conn, body))
            except (HttpError, OSError, asyncio.IncompleteReadError) as e:
                errors += 1
                if errors == 1:
                    print(f"  first error: {e}", flush=True)

    passes0, inputs0 = _batch_histogram(mesh)
    before, busy0, own0, t0 = cpu.sample(pids), cpu.read_machine_busy_ms(), _own_cpu_ms(), time.monotonic()
    await asyncio.gather(*(slot(conn) for conn in conns))
    after, busy1, own1, t1 = cpu.sample(pids), cpu.read_machine_busy_ms(), _own_cpu_ms(), time.monotonic()
    passes1, inputs1 = _batch_histogram(mesh)
    for conn in conns:
        conn.close()
    usage = cpu.usage_between(before, after)
    worker = sum(ms for name, ms in usage.per_process_ms.items() if name.startswith("embed"))
    bg = max(0.0, (busy1 - busy0) - usage.total_ms - (own1 - own0)) / 1000 / (t1 - t0)
    return EmbedRow(shape, c, len(bodies), errors, t1 - t0, usage.total_ms, worker, _percentile(latencies, 0.5),
                    _percentile(latencies, 0.99), bg, (inputs1 - inputs0) / max(1.0, passes1 - passes0))


def _own_cpu_ms() -> float:
    return cpu.read_threads_cpu_ms(os.getpid()) or 0.0


def run_mesh(cfg: EmbedBenchConfig, shape: str, emit: Printer, log_dir: Path) -> list[EmbedRow]:
    emit(f"# starting the {shape} mesh with one embedding worker ...")
    mesh = start_mesh(cfg, shape, log_dir)
    try:
        def body(text: str) -> bytes:
            return orjson.dumps({"model": MODEL, "input": text})

        rows = []
        for i, c in enumerate(cfg.concurrency):
            warm = [body(s) for s in sentences(cfg.warmup, cfg.words, cfg.seed + 1000 + i)]
            asyncio.run(_mesh_level(mesh, shape, min(c, len(warm)) or 1, warm))
            texts = sentences(cfg.requests_for(c), cfg.words, cfg.seed + i)
            row = asyncio.run(_mesh_level(mesh, shape, c, [body(t) for t in texts]))
            emit(f"  {shape} c={c}: {row.per_s:.0f} emb/s, {row.cpu_per_request(row.cpu_ms):.1f} CPU ms/req "
                 f"(worker {row.cpu_per_request(row.worker_cpu_ms):.1f}), {row.inputs_per_pass:.1f} inputs per "
                 f"forward pass, p50 {row.p50_ms:.1f} ms, "
                 f"errors {row.errors}, bg {row.bg_cores:.2f} cores")
            rows.append(row)
        return rows
    finally:
        problems = mesh.stop()
        if problems:
            emit(f"# mesh stop: {problems}")


def run_direct(cfg: EmbedBenchConfig, emit: Printer) -> list[EmbedRow]:
    from services.common.tokenizer_files import load_tokenizer
    from services.models.minilm import default_embedding_model_dir
    from services.workers.embed.model import SentenceEmbedder

    model_dir = default_embedding_model_dir()
    embedder = SentenceEmbedder(model_dir, threads=cfg.threads)
    tokenizer = load_tokenizer(model_dir)
    embedder.embed([tokenizer.encode(s).ids for s in sentences(cfg.warmup, cfg.words, cfg.seed + 999)])
    rows = []
    for i, c in enumerate(cfg.concurrency):
        texts = sentences(cfg.requests_for(c), cfg.words, cfg.seed + i)
        latencies = []
        busy0, own0, t0 = cpu.read_machine_busy_ms(), _own_cpu_ms(), time.monotonic()
        for start in range(0, len(texts), c):
            step = time.monotonic()
            embedder.embed([e.ids for e in tokenizer.encode_batch(texts[start:start + c])])
            latencies.append((time.monotonic() - step) * 1000)
        busy1, own1, t1 = cpu.read_machine_busy_ms(), _own_cpu_ms(), time.monotonic()
        own = own1 - own0
        bg = max(0.0, (busy1 - busy0) - own) / 1000 / (t1 - t0)
        row = EmbedRow("direct", c, len(texts), 0, t1 - t0, own, own, _percentile(latencies, 0.5),
                       _percentile(latencies, 0.99), bg, float(c))
        emit(f"  direct batch={c}: {row.per_s:.0f} emb/s, {row.cpu_per_request(own):.1f} CPU ms/emb, "
             f"p50 {row.p50_ms:.1f} ms per forward pass, bg {bg:.2f} cores")
        rows.append(row)
    return rows


LEGEND = ("emb/s: embeddings (requests of one input) completed per second. CPU ms/req: CPU of every mesh "
          "process (Envoy, gateway, stages, worker, NATS) per request; worker: the embedding worker's share. "
          "inputs/pass: mean inputs per forward pass, from the worker's meshfront_worker_embed_batch_inputs. "
          "direct: the same model in one process, c inputs tokenized and embedded per forward pass (latency "
          "is per forward pass). bg: cores other tenants used during the level.")


def markdown_table(rows: list[EmbedRow]) -> str:
    lines = [("| setting | c | requests | emb/s | CPU ms/req | worker CPU ms/req | inputs/pass | p50 ms | p99 ms "
             "| errors | bg cores |"), "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.setting} | {r.concurrency} | {r.requests} | {r.per_s:.0f} | "
                     f"{r.cpu_per_request(r.cpu_ms):.1f} | {r.cpu_per_request(r.worker_cpu_ms):.1f} | "
                     f"{r.inputs_per_pass:.1f} | "
                     f"{r.p50_ms:.1f} | {r.p99_ms:.1f} | {r.errors} | {r.bg_cores:.2f} |")
    return "\n".join(lines)


def run(cfg: EmbedBenchConfig, emit: Printer, log_dir: Path) -> list[EmbedRow]:
    rows: list[EmbedRow] = []
    if cfg.direct:
        emit("# direct: the model in this process")
        rows += run_direct(cfg, emit)
    for shape in cfg.shapes:
        rows += run_mesh(cfg, shape, emit, log_dir / shape)
    return rows
