"""Wires ``meshfront sglang-diffusion``: flags (services/workers/gpu_media.py) -> SGLang's ``DiffGenerator`` (model
loaded, its scheduler processes started) -> ``SglangDiffusionEngine`` -> the media glue (MediaService), registered
as an image or video model.

Runs where ``sglang.multimodal_gen`` imports and a CUDA GPU is visible (an image built FROM SGLang's); anywhere
else it ends at once with one line and status 1. ``--engine-args`` are ``DiffGenerator.from_pretrained``'s
keyword arguments (SGLang's diffusion ``ServerArgs``: ``num_gpus``, ``tp_size``, ``dit_cpu_offload``, ...).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from services.common.discovery import MediaLimits
from services.workers import entry
from services.workers.engine_worker import EngineStartFailed, root_message
from services.workers.gpu_media import GpuMediaConfig, parse_config, prompt_counter, require
from services.workers.media.server import media_serving

KIND = "sglang-diffusion"
# DiffGenerator.from_pretrained keywords the worker sets itself.
OWNED = {"model_path": "--model-dir"}
DESCRIPTION = "SGLang's diffusion serving (sglang.multimodal_gen, GPUs only) behind MediaService."


def prepare(cfg: GpuMediaConfig) -> GpuMediaConfig:
    require("sglang.multimodal_gen", "SGLang's diffusion serving",
            "sglang==0.5.23 with its `diffusion` extra, on a GPU machine",
            entry_module="sglang.multimodal_gen.runtime.entrypoints.diffusion_generator")
    return cfg


def start_engine(model_dir: str, engine_args: Mapping[str, Any], limits: MediaLimits) -> Any:
    """SGLang's DiffGenerator loaded (its scheduler processes started and warmed up: minutes, blocking) behind
    the adapter; also what tools/gpu_media_check.py starts."""
    from sglang.multimodal_gen import DiffGenerator

    from services.workers.sglang_diffusion.engine import SglangDiffusionEngine

    generator = DiffGenerator.from_pretrained(**engine_args, model_path=model_dir)  # model_path: refused in args
    return SglangDiffusionEngine(generator, limits, prompt_counter(model_dir))


async def build(cfg: GpuMediaConfig, events: entry.KvEvents) -> entry.Serving:
    try:  # off the event loop
        engine = await asyncio.to_thread(start_engine, cfg.worker.model_dir, cfg.engine_args, cfg.limits)
    except Exception as e:  # any failure to start is reported the same way
        raise EngineStartFailed(root_message(e)) from e

    async def close() -> None:
        await asyncio.to_thread(engine.close)

    return media_serving(cfg.worker, engine, cfg.jobs, closers=[close])


KIND_SPEC = entry.WorkerKind(name=KIND, parse=lambda argv: parse_config(KIND, DESCRIPTION, argv, owned=OWNED),
                             log_level=lambda cfg: cfg.worker.log_level, prepare=prepare, build=build)


def main(argv: Sequence[str] | None = None) -> None:
    entry.main(KIND_SPEC, argv)


if __name__ == "__main__":
    main()
