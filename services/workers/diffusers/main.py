"""Wires the diffusers worker: model directory -> pipelines on their device -> DiffusersEngine -> MediaService."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Sequence

from services.workers import entry
from services.workers.diffusers.config import DiffusersConfig, parse_config
from services.workers.diffusers.engine import DiffusersEngine
from services.workers.diffusers.pipeline import PipelineError, check_offload, derive_limits, load_pipelines
from services.workers.media.server import media_serving
from services.workers.server import EngineStartFailed


def prepare(cfg: DiffusersConfig) -> DiffusersConfig:
    for package in ("torch", "diffusers", "transformers"):
        if importlib.util.find_spec(package) is None:
            raise entry.Unavailable(f"{package} is not installed (requirements/lock.txt pins it)")
    try:
        check_offload(cfg)
    except PipelineError as e:
        raise ValueError(str(e)) from None
    return cfg


def build_engine(cfg: DiffusersConfig) -> DiffusersEngine:
    """Loads the pipeline (blocking) and derives the card's limits; a PipelineError is a bad value."""
    pipelines = load_pipelines(cfg)
    return DiffusersEngine(pipelines, derive_limits(cfg, pipelines), dict(cfg.pipeline_kwargs))


async def build(cfg: DiffusersConfig, events: entry.KvEvents) -> entry.Serving:
    try:
        # Loads before the port opens ("port open" means "ready"), off the loop so signals are still handled.
        engine = await asyncio.to_thread(build_engine, cfg)
    except PipelineError as e:
        raise EngineStartFailed(str(e)) from None

    async def close() -> None:
        await asyncio.to_thread(engine.close)

    return media_serving(cfg.worker, engine, cfg.jobs, closers=[close])


KIND = entry.WorkerKind(name="diffusers", parse=parse_config, log_level=lambda cfg: cfg.worker.log_level,
                        prepare=prepare, build=build)


def main(argv: Sequence[str] | None = None) -> None:
    entry.main(KIND, argv)
