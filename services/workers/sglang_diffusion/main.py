"""Wires ``meshfront sglang-diffusion``: flags (services/workers/gpu_media.py) -> SGLang's ``DiffGenerator`` (model
loaded, its scheduler processes started) -> ``SglangDiffusionEngine`` -> the media glue (MediaService), registered
as an image or video model.

Runs where ``sglang.multimodal_gen`` imports and a CUDA GPU is visible (an image built FROM SGLang's); anywhere
else it ends at once with one line and status 1. ``--engine-args`` are ``DiffGenerator.from_pretrained``'s
keyword arguments (SGLang's diffusion ``ServerArgs``: ``num_gpus``, ``tp_size``, ``dit_cpu_offload``, ...).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from services.common.discovery import MediaLimits
from services.workers import entry
from services.workers.gpu_media import GpuMediaConfig, gpu_media_kind, prompt_counter, require

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


KIND_SPEC = gpu_media_kind(KIND, DESCRIPTION, OWNED, prepare, start_engine)


def main(argv: Sequence[str] | None = None) -> None:
    entry.main(KIND_SPEC, argv)


if __name__ == "__main__":
    main()
