"""The ``tenants`` scenario: policy classes and tenant fairness in the router queue, under saturation.

``python -m bench tenants`` starts a mesh with ``--auth`` (mocker workers at real pace, the router holding what
its workers cannot take: ``--max-in-flight-per-worker`` and ``--queue-timeout-s``), declares two classes,
``premium`` (weight 4) and ``standard`` (weight 1), with Dynamo's ``--router-policy-config``, and creates one key
per tenant with ``meshfront keys create``:

- ``flood-premium`` (premium) and ``flood-standard`` (standard) each keep ``--flood`` streams open;
- ``neighbour`` (premium, the flooding premium tenant's neighbour in its class) sends 2 at a time;
- ``batch-owner`` (premium) runs a Batch API batch, whose lines run in the lowest class whatever the key's.

Phases, on the one mesh: each tenant ``alone`` (2 streams, nothing else running); ``shares`` (both floods:
requests served per tenant per window, their ratio against the 4:1 target); ``flood`` (both floods and the
neighbour: everyone's TTFT beside the floods); ``batch`` (the neighbour while a batch runs). TTFT percentiles
count a failed request (a 503 after ``--queue-timeout-s``, a 429, a timeout) as infinitely late, and each row
says how many failed: nothing is dropped from the figures. A request's "served" time is its first token (its
worker was booked just before). The run ends with one table (markdown) that bench/RESULTS.md records.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import io
import math
import os
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import orjson

from bench.cli_common import emit, machine_line
from bench.http import Connection
from bench.loadgen import RequestResult, chat_body, one_request
from bench.mesh import run_async
from bench.stats import percentile
from services.launcher.plan import ROOT, VENV_BIN, WorkerSpec, ephemeral_plan
from services.launcher.processes import Mesh
from services.models.build import build_demo_model
from services.router.core.policy_classes import weights_yaml

MODEL = "meshfront/demo-qwen"
CLASSES = (("premium", 4), ("standard", 1))
TENANTS = {"flood-premium": "premium", "flood-standard": "standard", "neighbour": "premium",
           "batch-owner": "premium"}


@dataclasses.dataclass(frozen=True)
class TenantsBenchConfig:
    workers: int = 2
    max_in_flight: int = 4  # per worker: the mesh serves workers * this at once, the rest waits in the router
    queue_timeout_s: float = 60.0
    speedup: float = 1.0
    flood: int = 48  # streams each flooding tenant keeps open
    light: int = 2  # the neighbour's streams
    prompt_words: int = 60
    flood_max_tokens: int = 24
    light_max_tokens: int = 8
    alone_s: float = 8.0
    shares_s: float = 30.0
    flood_s: float = 30.0
    batch_lines: int = 400
    window_s: float = 5.0


@dataclasses.dataclass
class Stream:
    """One tenant's requests in one phase."""

    tenant: str
    results: list[RequestResult] = dataclasses.field(default_factory=list)

    def ttft_ms(self, q: float) -> float:
        """Failed requests count as infinitely late (never dropped)."""
        values = [(r.ttft if r.ok and r.ttft is not None else math.inf) * 1000 for r in self.results]
        return percentile(values, q)

    @property
    def failed(self) -> int:
        return sum(1 for r in self.results if not r.ok)


def prompt(tenant: str, i: int, words: int) -> str:
    # Distinct per request: no prefix caching flatters anyone.
    return f"{tenant} request {i}: " + " ".join(f"w{(i * 7 + k) % 997}" for k in range(words))


async def closed_loop(url: str, key: str, tenant: str, streams: int, max_tokens: int, words: int,
                      until: float, timeout_s: float) -> Stream:
    """``streams`` connections, each sending its next request as soon as the last ended, until ``until``."""
    parts = urlsplit(url)
    out = Stream(tenant)
    counter = iter(range(10**9))

    async def one(conn: Connection) -> None:
        while time.monotonic() < until:
            body = chat_body(MODEL, prompt(tenant, next(counter), words), max_tokens, True)
            left = until - time.monotonic()
            if left <= 0:
                break
            result = await one_request(conn, body, min(timeout_s, left + timeout_s))
            if time.monotonic() <= until or result.ok:  # one cut at the phase's end is no failure
                out.results.append(result)
            if not result.ok:
                await asyncio.sleep(0.05)

    conns = [Connection(parts.hostname or "127.0.0.1", parts.port or 80, (("Authorization", f"Bearer {key}"),))
             for _ in range(streams)]
    try:
        await asyncio.gather(*(one(c) for c in conns))
    finally:
        for c in conns:
            c.close()
    return out


def served_windows(streams: list[Stream], start: float, window_s: float, end: float) -> list[dict[str, int]]:
    """Requests served (first token) per tenant in each window from ``start``."""
    windows = [dict.fromkeys((s.tenant for s in streams), 0) for _ in range(max(1, int((end - start) // window_s)))]
    for s in streams:
        for r in s.results:
            if r.ok and r.first_token is not None and start <= r.first_token < end:
                i = int((r.first_token - start) // window_s)
                if i < len(windows):
                    windows[i][s.tenant] += 1
    return windows


def keys(mesh: Mesh) -> dict[str, str]:
    """One key per tenant, created with ``meshfront keys create`` (its secret is the last line)."""
    out = {}
    for tenant, cls in TENANTS.items():
        run = subprocess.run([str(VENV_BIN / "meshfront"), "keys", "create", "--tenant", tenant, "--policy-class", cls],
                             capture_output=True, text=True, timeout=30, check=True,
                             env={**os.environ, "NATS_SERVER": mesh.plan.nats_url})
        out[tenant] = run.stdout.splitlines()[-1]
    return out


def start_batch(url: str, key: str, lines: int, max_tokens: int, words: int) -> str:
    """Uploads a chat batch and creates it (the OpenAI API's two calls); returns the batch id."""
    data = b"\n".join(orjson.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
                                    "body": {"model": MODEL, "max_tokens": max_tokens, "ignore_eos": True,
                                             "messages": [{"role": "user", "content": prompt("batch", i, words)}]}})
                      for i in range(lines)) + b"\n"
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        upload = client.post("/v1/files", data={"purpose": "batch"},
                             files={"file": ("input.jsonl", io.BytesIO(data), "application/jsonl")})
        upload.raise_for_status()
        batch = client.post("/v1/batches", json={"input_file_id": upload.json()["id"],
                                                 "endpoint": "/v1/chat/completions", "completion_window": "24h"})
        batch.raise_for_status()
        return str(batch.json()["id"])


def batch_counts(url: str, key: str, batch_id: str) -> dict[str, int]:
    r = httpx.get(f"{url}/v1/batches/{batch_id}", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    r.raise_for_status()
    return dict(r.json()["request_counts"])


async def phases(cfg: TenantsBenchConfig, url: str, secrets: dict[str, str], say) -> dict:
    """Every phase in turn; what each measured."""
    words, t = cfg.prompt_words, cfg.queue_timeout_s + 30

    def loop(tenant: str, streams: int, max_tokens: int, until: float):
        return closed_loop(url, secrets[tenant], tenant, streams, max_tokens, words, until, t)

    out: dict = {"alone": {}}
    for tenant in ("flood-premium", "flood-standard", "neighbour"):
        until = time.monotonic() + cfg.alone_s
        out["alone"][tenant] = await loop(tenant, cfg.light, cfg.light_max_tokens, until)
        say(f"alone {tenant}: TTFT p50 {out['alone'][tenant].ttft_ms(50):.0f} ms")
    await asyncio.sleep(1)
    start = time.monotonic()
    until = start + cfg.shares_s
    floods = await asyncio.gather(loop("flood-premium", cfg.flood, cfg.flood_max_tokens, until),
                                  loop("flood-standard", cfg.flood, cfg.flood_max_tokens, until))
    # The first window fills the slots in arrival order: shares count from the second.
    out["shares"] = (floods, served_windows(list(floods), start + cfg.window_s, cfg.window_s, until))
    await asyncio.sleep(3)  # the waiters of the cut clients leave the queue
    until = time.monotonic() + cfg.flood_s
    out["flood"] = await asyncio.gather(loop("flood-premium", cfg.flood, cfg.flood_max_tokens, until),
                                        loop("flood-standard", cfg.flood, cfg.flood_max_tokens, until),
                                        loop("neighbour", cfg.light, cfg.light_max_tokens, until + 0.5))
    await asyncio.sleep(3)
    owner = secrets["batch-owner"]
    batch_id = await asyncio.to_thread(start_batch, url, owner, cfg.batch_lines, cfg.flood_max_tokens, words)
    deadline = time.monotonic() + 30
    while not (await asyncio.to_thread(batch_counts, url, owner, batch_id))["completed"]:  # its lines run
        if time.monotonic() > deadline:
            raise RuntimeError(f"batch {batch_id} completed no line in 30 s")
        await asyncio.sleep(0.2)
    before = await asyncio.to_thread(batch_counts, url, owner, batch_id)
    out["batch"] = await loop("neighbour", cfg.light, cfg.light_max_tokens, time.monotonic() + cfg.alone_s)
    after = await asyncio.to_thread(batch_counts, url, owner, batch_id)
    out["batch_counts"] = (before["completed"], after["completed"], after["total"])
    return out


def report(cfg: TenantsBenchConfig, out: dict) -> str:
    alone: dict[str, Stream] = out["alone"]
    floods, windows = out["shares"]
    ratios = [w["flood-premium"] / w["flood-standard"] if w["flood-standard"] else math.inf for w in windows]
    total = {s.tenant: sum(w[s.tenant] for w in windows) for s in floods}
    overall = total["flood-premium"] / max(1, total["flood-standard"])
    lines = [f"Shares, requests served per {cfg.window_s:g} s window (premium:standard, target 4:1 ±20 %): "
             + ", ".join(f"{w['flood-premium']}:{w['flood-standard']} ({r:.2f})" for w, r in zip(windows, ratios,
                                                                                              strict=True))
             + f"; overall {overall:.2f} ({'within' if 3.2 <= overall <= 4.8 else 'OUTSIDE'} ±20 %). Failed: "
             + ", ".join(f"{s.tenant} {s.failed}/{len(s.results)}" for s in floods) + ".", "",
             "| tenant (class) | phase | streams | requests | failed | TTFT p50 ms | TTFT p99 ms | p50 / alone |",
             "|---|---|---|---|---|---|---|---|"]

    def row(s: Stream, phase: str, streams: int) -> str:
        base = alone[s.tenant].ttft_ms(50)
        return (f"| {s.tenant} ({TENANTS[s.tenant]}) | {phase} | {streams} | {len(s.results)} | {s.failed} | "
                f"{s.ttft_ms(50):.0f} | {s.ttft_ms(99):.0f} | {s.ttft_ms(50) / base:.2f} |")

    for s in alone.values():
        lines.append(row(s, "alone", cfg.light))
    for s in out["flood"]:
        lines.append(row(s, "beside both floods", cfg.light if s.tenant == "neighbour" else cfg.flood))
    lines.append(row(out["batch"], f"beside a {cfg.batch_lines}-line batch", cfg.light))
    neighbour = next(s for s in out["flood"] if s.tenant == "neighbour")
    ratio = neighbour.ttft_ms(50) / alone["neighbour"].ttft_ms(50)
    first, last, total = out["batch_counts"]
    lines += ["", f"Flooded neighbour's TTFT p50 / alone: {ratio:.2f} (target <= 2.5). The batch (its lines in the "
              f"lowest class) completed lines {first} to {last} of {total} during the neighbour's phase"
              + (" (it ended within the phase: a larger --batch-lines keeps it running throughout)."
                 if last == total else ".")]
    return "\n".join(lines)


def run(cfg: TenantsBenchConfig, say=emit) -> str:
    model_dir = str(build_demo_model(ROOT / ".run" / "build" / "models" / "demo-qwen", with_weights=False))
    run_dir = ROOT / ".run" / "bench"
    run_dir.mkdir(parents=True, exist_ok=True)
    policy = run_dir / f"tenants-policy-{os.getpid()}.yaml"
    policy.write_text(weights_yaml(CLASSES))
    extra = ("--speedup-ratio", f"{cfg.speedup:g}")
    workers = [WorkerSpec(model_dir, MODEL, "mocker", extra) for _ in range(cfg.workers)]
    router = ("--max-in-flight-per-worker", str(cfg.max_in_flight), "--queue-timeout-s", f"{cfg.queue_timeout_s:g}",
              "--router-policy-config", str(policy))
    plan = ephemeral_plan(workers, run_dir=run_dir, log_level="WARNING",
                          service_args={"router": router, "gateway": ("--auth",)})
    mesh = Mesh(plan, run_dir / f"tenants-{time.strftime('%H%M%S')}")
    try:
        mesh.start(timeout=120)
        out = run_async(phases(cfg, mesh.url, keys(mesh), say))
    except BaseException:
        say(f"tenants bench failed; logs:\n{mesh.all_logs()}")
        raise
    finally:
        mesh.stop()
        policy.unlink(missing_ok=True)
    return report(cfg, out)


def add_parser(sub) -> None:
    d = TenantsBenchConfig()
    t = sub.add_parser("tenants", help="policy classes (weights 4:1) and tenant fairness under saturation, "
                       "with --auth keys; a batch beside interactive traffic")
    for field in dataclasses.fields(d):
        t.add_argument(f"--{field.name.replace('_', '-')}", type=type(getattr(d, field.name)),
                       default=getattr(d, field.name))
    t.add_argument("--markdown", default="", help="append the table to this file")


def run_tenants(args: argparse.Namespace, command: str) -> int:
    cfg = TenantsBenchConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TenantsBenchConfig)})
    started = datetime.datetime.now().astimezone()
    emit(f"# {started:%Y-%m-%d %H:%M %Z}; {machine_line()}; {cfg}")
    table = run(cfg)
    emit("\n" + table)
    if args.markdown:
        with Path(args.markdown).open("a") as f:
            f.write(f"\n### `{command}`\n\n{started:%Y-%m-%d %H:%M %Z}. Machine: {machine_line()}.\n"
                    f"Setting: {cfg}.\n\n{table}\n")
    return 0
