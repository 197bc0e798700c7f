"""Wires ``meshfront vllm-omni``: flags (services/workers/gpu_media.py) -> vLLM-Omni's ``AsyncOmni`` (its stages
loaded, on an event loop thread of its own) -> ``VllmOmniEngine`` -> the media glue (MediaService), registered as
an image or video model.

Runs where ``vllm_omni`` imports (next to the vLLM release it was built for: vLLM-Omni 0.30.0 needs vLLM 0.30,
not the 0.32 of ``meshfront vllm``) and a CUDA GPU is visible; anywhere else it ends at once with one line and
status 1. ``--engine-args`` are ``AsyncOmni``'s keyword arguments (vLLM's engine arguments and vLLM-Omni's
``stage_configs_path``, ``vae_use_slicing``, ...).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from services.common.discovery import MediaLimits
from services.workers import entry
from services.workers.gpu_media import GpuMediaConfig, gpu_media_kind, prompt_counter, require

KIND = "vllm-omni"
# AsyncOmni keywords the worker sets itself.
OWNED = {"model": "--model-dir"}
DESCRIPTION = "vLLM-Omni's diffusion serving (vllm_omni.AsyncOmni, GPUs only) behind MediaService."


def prepare(cfg: GpuMediaConfig) -> GpuMediaConfig:
    require("vllm_omni", "vLLM-Omni", "vllm-omni==0.30.0 next to vllm 0.30, on a GPU machine",
            entry_module="vllm_omni.entrypoints.async_omni")
    return cfg


def start_engine(model_dir: str, engine_args: Mapping[str, Any], limits: MediaLimits) -> Any:
    """vLLM-Omni's AsyncOmni loaded (its stages started: minutes, blocking) on an event loop thread of its own,
    behind the adapter; also what tools/gpu_media_check.py starts."""
    from vllm_omni import AsyncOmni

    from services.workers.vllm_omni.engine import VllmOmniEngine, sampling_params_list

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="vllm-omni-loop", daemon=True).start()

    async def start() -> Any:  # AsyncOmni binds to the loop it is made on
        return AsyncOmni(model=model_dir, **engine_args)  # model: refused in --engine-args

    try:
        omni = asyncio.run_coroutine_threadsafe(start(), loop).result()
    except BaseException:
        loop.call_soon_threadsafe(loop.stop)
        raise
    return VllmOmniEngine(omni, loop, limits, prompt_counter(model_dir), sampling_params_list(omni))


KIND_SPEC = gpu_media_kind(KIND, DESCRIPTION, OWNED, prepare, start_engine)


def main(argv: Sequence[str] | None = None) -> None:
    entry.main(KIND_SPEC, argv)


if __name__ == "__main__":
    main()
