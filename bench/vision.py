"""The ``vision`` scenario: the cached share of repeated images under kv routing vs text on the same prefix structure.

``python -m bench vision`` starts a fresh mesh per variant (``--workers`` image-declaring mockers, kv router) and
drives the same closed-loop load (same seed: same group sequence and tails) on each:

- ``image``: each of ``groups`` groups shares an image (a distinct 224 x 224 PNG per group, 64 image tokens
  once the preprocessor places it) followed by shared text; each request adds a unique tail;
- ``text``: the same groups and text, with the image replaced by group-specific text of about the same
  number of tokens.

The cached share is sum(usage cached_tokens) / sum(prompt_tokens) over the requests. An image that hashed
differently per request, or not at all, would show as a lower share than text; the goal is within 3 points
(issue 20). Images travel as data URLs, so the fetch path is not measured here (tests/mesh/test_vision.py
covers it).
"""

from __future__ import annotations

import base64
import dataclasses
import io
import random
import time

from bench.kv import scrape
from bench.loadgen import LoadSpec, run_load
from bench.mesh import run_async
from bench.prompts import WORDS
from bench.stats import summarize
from services.launcher.plan import ROOT, WorkerSpec, ephemeral_plan
from services.launcher.processes import Mesh

IMAGE_SIDE = 224  # 8 x 8 Qwen2-VL tiles: 64 tokens
IMAGE_TEXT_WORDS = 64  # the text variant's stand-in for an image


@dataclasses.dataclass(frozen=True)
class VisionBenchConfig:
    workers: int = 4
    num_gpu_blocks: int = 512
    speedup: float = 5.0
    groups: int = 16
    shared_words: int = 400
    tail_words: int = 100
    concurrency: int = 16
    requests: int = 240
    max_tokens: int = 8
    model_name: str = "meshfront/demo-qwen"
    seed: int = 17
    timeout_s: float = 300.0


def _png_data_url(rng: random.Random) -> str:
    """A PNG of random pixels (distinct bytes per call) as a data URL."""
    from PIL import Image

    img = Image.frombytes("RGB", (IMAGE_SIDE, IMAGE_SIDE), rng.randbytes(IMAGE_SIDE * IMAGE_SIDE * 3))
    out = io.BytesIO()
    img.save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


class GroupedImagePrompts:
    """Content parts: a group's image (or its text stand-in), the group's shared text, a unique tail."""

    def __init__(self, cfg: VisionBenchConfig, with_images: bool, seed: int):
        rng = random.Random(seed)
        self._groups = []
        for _ in range(cfg.groups):
            head = ({"type": "image_url", "image_url": {"url": _png_data_url(rng)}} if with_images
                    else {"type": "text", "text": " ".join(rng.choices(WORDS, k=IMAGE_TEXT_WORDS))})
            self._groups.append((head, " ".join(rng.choices(WORDS, k=cfg.shared_words))))
        self._tail_words = cfg.tail_words
        self._rng = random.Random(seed + 1)

    def next_prompt(self) -> list[dict]:
        head, shared = self._rng.choice(self._groups)
        tail = " ".join(self._rng.choices(WORDS, k=self._tail_words))
        return [head, {"type": "text", "text": f"{shared} {tail}"}]


@dataclasses.dataclass
class VariantResult:
    name: str
    ok: int
    errors: int
    ttft_p50: float
    req_per_s: float
    prompt_tokens: float
    cached_share: float
    predicted_share: float
    first_errors: list[str]


def _variant(mesh: Mesh, metrics_port: int, cfg: VisionBenchConfig, name: str, with_images: bool,
             seed: int) -> VariantResult:
    before = scrape([metrics_port])
    spec = LoadSpec(url=mesh.url, model=cfg.model_name, concurrency=cfg.concurrency, requests=cfg.requests,
                    max_tokens=cfg.max_tokens, duration_s=cfg.timeout_s, request_timeout_s=120.0)
    load = run_async(run_load(spec, GroupedImagePrompts(cfg, with_images, seed)))
    time.sleep(0.5)  # the last first-token reports reach the router
    after = scrape([metrics_port])

    def delta(metric: str) -> float:
        return sum(after.get(metric, {}).values()) - sum(before.get(metric, {}).values())

    stats = summarize(load)
    ok = [r for r in load.results if r.ok]
    prompt = sum(r.prompt_tokens for r in ok) or 1
    reported = delta("meshfront_router_reported_prompt_tokens_total") or 1
    return VariantResult(name, stats.ok, stats.errors, stats.ttft_ms[50], stats.req_per_s, prompt / max(1, len(ok)),
                         sum(r.cached_tokens for r in ok) / prompt,
                         delta("meshfront_router_predicted_cached_tokens_total") / reported, stats.first_errors)


HEADER = ("| variant | ok/err | TTFT p50 ms | req/s | mean prompt tokens | cached share | predicted share |\n"
          "|---|---|---|---|---|---|---|")


def row(r: VariantResult) -> str:
    return (f"| {r.name} | {r.ok}/{r.errors} | {r.ttft_p50:.0f} | {r.req_per_s:.1f} | {r.prompt_tokens:.0f} | "
            f"{r.cached_share:.3f} | {r.predicted_share:.3f} |")


def run(cfg: VisionBenchConfig, emit) -> str:
    """Each variant on a fresh mesh with the same seed (the same group sequence and tails; only the group's head
    differs); returns the markdown table with the gap in points."""
    from services.models.build import build_demo_model

    model_dir = str(build_demo_model(ROOT / "build" / "models" / "demo-qwen"))
    extra = ("--speedup-ratio", f"{cfg.speedup:g}", "--num-gpu-blocks", str(cfg.num_gpu_blocks),
             "--input-modalities", "image")
    results = []
    for name, with_images in (("text", False), ("image", True)):
        workers = [WorkerSpec(model_dir, cfg.model_name, "mocker", extra) for _ in range(cfg.workers)]
        plan = ephemeral_plan(workers, router_mode="kv", run_dir=ROOT / ".run" / "bench", log_level="WARNING")
        mesh = Mesh(plan, ROOT / ".run" / "bench" / f"vision-{name}-{time.strftime('%H%M%S')}")
        try:
            mesh.start()
            time.sleep(1.5)  # the router loads every worker's (empty) KV state
            emit(f"[{name}] {cfg.requests} requests at c={cfg.concurrency} ...")
            # Every service of an ephemeral plan is scrapeable: the router's port is in the plan.
            r = _variant(mesh, plan.metrics_ports["router"], cfg, name, with_images, cfg.seed)
            emit(row(r) + (f" errors: {r.first_errors}" if r.errors else ""))
            results.append(r)
        except BaseException:
            emit(f"[{name}] failed; logs:\n{mesh.all_logs()}")
            raise
        finally:
            mesh.stop()
    gap = (results[0].cached_share - results[1].cached_share) * 100
    return HEADER + "\n" + "\n".join(row(r) for r in results) + f"\n\nText minus image cached share: {gap:+.1f} points."
