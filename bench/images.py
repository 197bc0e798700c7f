"""``python -m bench images``: the tiny diffusers pipeline in-process, behind its worker, and through the mesh.

Every leg generates the same images one after another (c=1: a diffusers worker runs one job at a time,
so concurrency would only queue), the legs taking turns in rounds so that the machine's drifting load
falls on each alike, from the tiny random Stable Diffusion pipeline built in code
(services/models/tiny_diffusion.py), at the same size, steps and torch threads:

- **direct**: ``StableDiffusionPipeline`` called in this process, the PIL image it returns; no encoding,
  no gRPC, no HTTP. The floor.
- **worker**: a ``meshfront diffusers`` process over that directory, called with ``MediaService.GenerateMedia``
  from this process (PNG encoding, chunks, gRPC on loopback). What the worker adds.
- **mesh**: a fresh mesh (NATS, the diffusers worker, the stages, Envoy) and ``POST /v1/images/generations``
  with ``response_format=b64_json`` over one keep-alive connection. Needs the gateway's Images API.

Overhead is each leg's seconds per image minus direct's, as a share of direct's (the issue's goal: the
mesh adds at most 5 % of the generation time). The tiny model's generation is a few tens of ms, so its
overhead share is an upper bound: a real model's steps take seconds while the mesh's cost stays the same.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson

Printer = Callable[[str], None]
LEGS = ("direct", "worker", "mesh")
MODEL = "meshfront/tiny-diffusion"
PROMPTS = ("a lighthouse on a cliff at dusk", "a bowl of ripe pears", "a red tram in the rain",
           "a fox asleep in the snow", "an orange kite over a beach")


@dataclasses.dataclass(frozen=True)
class ImageBenchConfig:
    legs: tuple[str, ...] = LEGS
    images: int = 30
    warmup: int = 3
    size: int = 64
    steps: int = 2
    threads: int = 1  # torch threads of the worker and of the direct leg alike
    rounds: int = 5  # the legs alternate, images / rounds at a time
    log_level: str = "WARNING"


@dataclasses.dataclass(frozen=True)
class ImageRow:
    leg: str
    images: int
    wall_s: float  # summed over the leg's images (the legs alternate)
    p50_s: float
    p99_s: float

    @property
    def per_s(self) -> float:
        return self.images / self.wall_s if self.wall_s else 0.0

    @property
    def s_per_image(self) -> float:
        return self.wall_s / self.images if self.images else 0.0


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


Leg = Callable[[int], Awaitable[None]]  # generates image i


def direct_leg(cfg: ImageBenchConfig, model_dir: Path) -> Leg:
    import torch
    from diffusers import DiffusionPipeline
    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.disable_progress_bar()
    torch.set_num_threads(cfg.threads)
    pipe = DiffusionPipeline.from_pretrained(str(model_dir), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)

    async def one(i: int) -> None:  # blocks the loop: nothing else runs in this process meanwhile
        pipe(PROMPTS[i % len(PROMPTS)], num_inference_steps=cfg.steps, height=cfg.size, width=cfg.size,
             generator=torch.Generator("cpu").manual_seed(i), output_type="pil")

    return one


def start_worker(cfg: ImageBenchConfig, model_dir: Path) -> tuple[subprocess.Popen, str]:
    """A ``meshfront diffusers`` process; returns it and the address it printed with READY."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.workers.diffusers", "--model-dir", str(model_dir), "--model-name", MODEL,
         "--port", "0", "--host", "127.0.0.1", "--no-register", "--threads", str(cfg.threads),
         "--default-steps", str(cfg.steps), "--log-level", cfg.log_level],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("READY "):
        proc.kill()
        raise SystemExit(f"the diffusers worker did not start (exit {proc.wait()})")
    return proc, line.split()[-1]


def worker_leg(cfg: ImageBenchConfig, address: str, closers: list[Callable[[], Awaitable[None]]]) -> Leg:
    import grpc
    from meshfront.worker.v1 import media_pb2, media_pb2_grpc

    from services.common.grpc_server import CHANNEL_OPTIONS

    channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
    closers.append(channel.close)
    stub = media_pb2_grpc.MediaServiceStub(channel)

    async def one(i: int) -> None:
        req = media_pb2.GenerateMediaRequest(
            request_id=f"bench-{i}", model=MODEL, kind=media_pb2.MEDIA_KIND_IMAGE, prompt=PROMPTS[i % len(PROMPTS)],
            width=cfg.size, height=cfg.size, n=1, num_inference_steps=cfg.steps, seed=i, output_format="png")
        size = 0
        async for event in stub.GenerateMedia(req, timeout=120):
            if event.WhichOneof("event") == "chunk":
                size += len(event.chunk.data)
        if not size:
            raise RuntimeError("the worker sent no image")

    return one


async def mesh_leg(cfg: ImageBenchConfig, port: int, closers: list[Callable[[], Awaitable[None]]]) -> Leg:
    from bench.http import Connection, HttpError

    conn = Connection("127.0.0.1", port)
    await conn.connect()

    async def close() -> None:
        conn.close()

    closers.append(close)

    async def one(i: int) -> None:
        body = orjson.dumps({"model": MODEL, "prompt": PROMPTS[i % len(PROMPTS)], "size": f"{cfg.size}x{cfg.size}",
                             "response_format": "b64_json",
                             "nvext": {"num_inference_steps": cfg.steps, "seed": i}})
        payload = b"".join([p async for _, p in conn.post_stream("/v1/images/generations", body)])
        try:
            base64.b64decode(orjson.loads(payload)["data"][0]["b64_json"], validate=True)
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise HttpError(f"no image in {payload[:200]!r}") from e

    return one


def start_mesh(cfg: ImageBenchConfig, model_dir: Path, log_dir: Path) -> Any:
    from services.launcher.plan import ROOT, WorkerSpec, ephemeral_plan
    from services.launcher.processes import Mesh

    worker = WorkerSpec(str(model_dir), MODEL, "diffusers",
                        ("--threads", str(cfg.threads), "--default-steps", str(cfg.steps)))
    plan = ephemeral_plan([worker], run_dir=ROOT / ".run" / "bench", log_level=cfg.log_level)
    mesh = Mesh(plan, log_dir)
    mesh.start(timeout=180)
    return mesh


async def measure(cfg: ImageBenchConfig, legs: dict[str, Leg]) -> list[ImageRow]:
    """Warms every leg, then alternates them in rounds (the machine's load drifts; each leg sees the same)."""
    for one in legs.values():
        for i in range(cfg.warmup):
            await one(i)
    latencies: dict[str, list[float]] = {leg: [] for leg in legs}
    per_round = max(1, cfg.images // max(1, cfg.rounds))
    order = list(legs)
    done = 0
    while done < cfg.images:
        count = min(per_round, cfg.images - done)
        for leg in order:
            for i in range(done, done + count):
                t = time.monotonic()
                await legs[leg](i)
                latencies[leg].append(time.monotonic() - t)
        done += count
        order = order[1:] + order[:1]
    return [ImageRow(leg, len(values), sum(values), _percentile(values, 0.5), _percentile(values, 0.99))
            for leg, values in latencies.items()]


def describe(row: ImageRow, direct: ImageRow | None) -> str:
    line = (f"  {row.leg}: {row.per_s:.2f} images/s, {row.s_per_image * 1000:.1f} ms/image "
            f"(p50 {row.p50_s * 1000:.1f} ms, p99 {row.p99_s * 1000:.1f} ms, {row.images} images)")
    if direct is not None and row is not direct and direct.s_per_image:
        extra = row.s_per_image - direct.s_per_image
        line += f", +{extra * 1000:.1f} ms/image over direct ({100 * extra / direct.s_per_image:.1f} %)"
    return line


LEGEND = ("images/s and ms/image: sequential images (c=1), the legs alternating in rounds; time summed over a "
          "leg's images. direct: the "
          "diffusers pipeline in this process (PIL out); worker: `meshfront diffusers` over gRPC (PNG out); "
          "mesh: POST /v1/images/generations through Envoy and the gateway (b64_json out). The share is the "
          "added ms/image over direct's ms/image.")


def markdown_table(rows: list[ImageRow]) -> str:
    direct = next((r for r in rows if r.leg == "direct"), None)
    lines = ["| leg | images | images/s | ms/image | p50 ms | p99 ms | over direct |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        over = ""
        if direct is not None and r is not direct and direct.s_per_image:
            extra = r.s_per_image - direct.s_per_image
            over = f"+{extra * 1000:.1f} ms ({100 * extra / direct.s_per_image:.1f} %)"
        lines.append(f"| {r.leg} | {r.images} | {r.per_s:.2f} | {r.s_per_image * 1000:.1f} | {r.p50_s * 1000:.1f} | "
                     f"{r.p99_s * 1000:.1f} | {over} |")
    return "\n".join(lines)


def run(cfg: ImageBenchConfig, emit: Printer, log_dir: Path) -> list[ImageRow]:
    from services.models.tiny_diffusion import default_diffusion_model_dir

    model_dir = default_diffusion_model_dir() / "text-to-image"
    emit(f"# model {model_dir}: {cfg.size}x{cfg.size}, {cfg.steps} steps, {cfg.threads} torch thread(s), "
         f"legs {', '.join(cfg.legs)} alternating in {cfg.rounds} rounds")
    worker = start_worker(cfg, model_dir) if "worker" in cfg.legs else None
    mesh = start_mesh(cfg, model_dir, log_dir / "mesh") if "mesh" in cfg.legs else None

    async def main() -> list[ImageRow]:
        closers: list[Callable[[], Awaitable[None]]] = []
        legs: dict[str, Leg] = {}
        try:
            for leg in cfg.legs:
                if leg == "direct":
                    legs[leg] = direct_leg(cfg, model_dir)
                elif leg == "worker":
                    assert worker is not None
                    legs[leg] = worker_leg(cfg, worker[1], closers)
                else:
                    legs[leg] = await mesh_leg(cfg, mesh.plan.http_port, closers)
            return await measure(cfg, legs)
        finally:
            for close in closers:
                await close()

    try:
        rows = asyncio.run(main())
    finally:
        if worker is not None:
            worker[0].terminate()
            worker[0].wait(30)
        if mesh is not None:
            mesh.stop()
    direct = next((r for r in rows if r.leg == "direct"), None)
    for row in rows:
        emit(describe(row, direct))
    return rows
