"""What the GPU-only media workers share (``meshfront sglang-diffusion``, ``meshfront vllm-omni``): their flags,
the limits their card advertises, and the checks that end them with one line when the engine package or a GPU
is missing.

Flags: the shared worker flags (env twins ``MESHFRONT_<KIND>_*``), ``--media image|video`` (what the model
makes, so which endpoint it registers for), the limits the gateway enforces (``--max-size``, ``--default-size``,
``--max-steps``, ...), the media job bounds (``--max-running-jobs``, ``--max-waiting-jobs``), and
``--engine-args JSON``: keyword arguments handed to the engine's own constructor unchanged (SGLang's
``DiffGenerator.from_pretrained``, vLLM-Omni's ``Omni``), so an engine option means what the engine's docs say.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from services.common.discovery import MediaLimits
from services.common.flags import FlagParser
from services.workers import entry
from services.workers.config import ConfigError, WorkerConfig, add_worker_flags, worker_config_from_args
from services.workers.engine_worker import EngineStartFailed, root_message
from services.workers.media.config import JobLimits, add_job_flags, job_limits_from_args, limit_errors, parse_size
from services.workers.media.encode import IMAGE_CONTENT_TYPES, VIDEO_CONTENT_TYPES
from services.workers.media.server import media_serving

log = logging.getLogger(__name__)

MEDIA_KINDS = ("image", "video")
# A limit flag left at 0 takes the kind's own. Videos are held whole in memory (every frame), as the
# engines hold them; 81 frames at 16 fps is Wan's default clip.
DEFAULTS = {
    "image": MediaLimits(max_width=2048, max_height=2048, default_width=1024, default_height=1024, max_n=4,
                         default_steps=30, max_steps=100, output_formats=tuple(IMAGE_CONTENT_TYPES)),
    "video": MediaLimits(max_width=1280, max_height=1280, default_width=832, default_height=480, max_n=1,
                         default_steps=30, max_steps=100, output_formats=tuple(VIDEO_CONTENT_TYPES),
                         default_fps=16.0, max_frames=129, default_frames=81),
}


@dataclasses.dataclass(frozen=True)
class GpuMediaConfig:
    worker: WorkerConfig
    media: str  # "image" | "video"
    limits: MediaLimits
    jobs: JobLimits
    engine_args: Mapping[str, Any]  # the engine constructor's keyword arguments, as given


def parse_config(kind: str, description: str, argv: Sequence[str], env: Mapping[str, str] | None = None, *,
                 owned: Mapping[str, str]) -> GpuMediaConfig:
    """Parses and checks every flag without importing the engine; raises ConfigError listing every problem.
    ``owned``: engine keyword arguments the worker sets itself -> the flag to use instead."""
    p = FlagParser(kind, description, env)
    add_worker_flags(p, engine_sized=True)
    add_job_flags(p)
    p.add("--media", default="", choices=("", *MEDIA_KINDS), help="what the model makes: image or video (required)")
    p.add("--max-size", default="", help="largest WxH a request may ask for (default: 2048x2048 images, 1280x1280 "
                                         "videos)")
    p.add("--default-size", default="", help="WxH when a request gives none (default: 1024x1024, 832x480)")
    p.add("--size-multiple", default=16, type=int, help="width and height are multiples of this (VAE x patch)")
    p.add("--max-n", default=0, type=int, help="most outputs per request (default: 4 images, 1 video)")
    p.add("--default-steps", default=30, type=int, help="denoising steps when a request gives none")
    p.add("--max-steps", default=100, type=int, help="most denoising steps a request may ask for")
    p.add("--default-frames", default=0, type=int, help="videos: frames when a request gives none (default 81)")
    p.add("--max-frames", default=0, type=int, help="videos: most frames per video (default 129)")
    p.add("--default-fps", default=0.0, type=float, help="videos: frames per second by default (default 16)")
    p.add("--takes-image", default=False, type=bool,
          help="the model takes an input image (image-to-image, edits, a video's first frame)")
    p.add("--engine-args", default="{}", help="JSON object of keyword arguments for the engine's constructor")
    args = p.parse(argv)
    errors: list[str] = []
    if not args.media:
        errors.append("--media is required: image or video")
    worker = worker_config_from_args(args, kind, context_length=0, block_size=1)
    errors += worker.validate()  # --model-dir, --port, --drain-grace-s, ...
    engine_args = _engine_args(args.engine_args, errors)
    errors += [f"--engine-args: {key!r} is set by the worker; use {flag}" for key, flag in owned.items()
               if key in engine_args]
    jobs = job_limits_from_args(args)
    errors += jobs.validate()
    limits = _limits(args, errors) if args.media else MediaLimits()
    if errors:
        raise ConfigError(errors)
    return GpuMediaConfig(worker=worker, media=args.media, limits=limits, jobs=jobs, engine_args=engine_args)


def _engine_args(text: str, errors: list[str]) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        errors.append(f"--engine-args is not JSON: {e}")
        return {}
    if not isinstance(value, dict):
        errors.append("--engine-args must be a JSON object of keyword arguments")
        return {}
    return value


def _limits(args: Any, errors: list[str]) -> MediaLimits:
    base = DEFAULTS[args.media]
    changes: dict[str, Any] = {"size_multiple": args.size_multiple, "max_n": args.max_n or base.max_n,
                               "default_steps": args.default_steps, "max_steps": args.max_steps,
                               "takes_image": args.takes_image}
    if args.max_size and (size := parse_size(args.max_size, "--max-size", errors)):
        changes.update(max_width=size[0], max_height=size[1])
    if args.default_size and (size := parse_size(args.default_size, "--default-size", errors)):
        changes.update(default_width=size[0], default_height=size[1])
    if args.media == "video":
        changes.update(default_frames=args.default_frames or base.default_frames,
                       max_frames=args.max_frames or base.max_frames, default_fps=args.default_fps or base.default_fps)
    limits = dataclasses.replace(base, **changes)
    errors += limit_errors(limits, args.media == "video")
    return limits


def require(package: str, engine: str, install: str, entry_module: str = "") -> None:
    """The engine's package imports here (its ``entry_module`` too, with whatever extra it needs) and a CUDA
    GPU is visible, or ``Unavailable`` with one line.

    Both engines run their diffusion models on GPUs only (their native models are CUDA ones), so a worker
    without one would load for minutes and then fail inside the engine.
    """
    try:
        found = importlib.util.find_spec(package) is not None
    except ModuleNotFoundError:  # its parent package is missing
        found = False
    if not found:
        raise entry.Unavailable(f"{engine} is not installed in this environment ({install})")
    if entry_module:
        try:
            importlib.import_module(entry_module)
        except ImportError as e:
            raise entry.Unavailable(f"{engine} does not import in this environment: {e} ({install})") from None
    try:
        import torch
    except ImportError:
        raise entry.Unavailable(f"{engine} needs torch with CUDA; torch is not installed here") from None
    if not torch.cuda.is_available():
        raise entry.Unavailable(f"{engine} runs on NVIDIA GPUs only and none is visible here; "
                                "`meshfront diffusers` serves the same model directories on a CPU")


def prompt_counter(model_dir: str) -> Callable[[str], int]:
    """Prompt tokens as the model's (first) text encoder counts them, from a diffusers-layout directory's
    ``tokenizer/``; a model without one reports 0 input tokens (said once, at start)."""
    tokenizer_dir = Path(model_dir) / "tokenizer"
    if not tokenizer_dir.is_dir():
        log.warning("%s has no tokenizer/ directory: usage will report 0 input tokens", model_dir)
        return lambda prompt: 0
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    return lambda prompt: len(tokenizer(prompt).input_ids)


def gpu_media_kind(name: str, description: str, owned: Mapping[str, str], prepare: Callable[[GpuMediaConfig], Any],
                   start_engine: Callable[[str, Mapping[str, Any], MediaLimits], Any]) -> entry.WorkerKind:
    """A GPU media engine's worker kind: its flags, its ``prepare`` (the package and GPU checks), and
    ``start_engine(model_dir, engine_args, limits)`` (blocking: the model loads) behind the media glue."""

    async def build(cfg: GpuMediaConfig, events: entry.KvEvents) -> entry.Serving:
        try:  # off the event loop
            engine = await asyncio.to_thread(start_engine, cfg.worker.model_dir, cfg.engine_args, cfg.limits)
        except Exception as e:  # any failure to start is reported the same way
            raise EngineStartFailed(root_message(e)) from e

        async def close() -> None:
            await asyncio.to_thread(engine.close)

        return media_serving(cfg.worker, engine, cfg.jobs, closers=[close])

    return entry.WorkerKind(name=name, parse=lambda argv: parse_config(name, description, argv, owned=owned),
                            log_level=lambda cfg: cfg.worker.log_level, prepare=prepare, build=build)
