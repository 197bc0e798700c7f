"""diffusers worker configuration: the shared worker flags, the engine arguments passed through to diffusers,
and the limits its card advertises (env twins MESHFRONT_DIFFUSERS_*).

A limit left at 0 is derived from the model when it loads (engine.py ``derive_limits``): the default size
from the denoiser's sample size times the VAE's scale factor, the frame limit from a motion adapter's
positional table. Only what the flags alone can tell is checked here; the rest fails the start in
``prepare`` with one line.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from services.common.flags import FlagParser
from services.workers.config import ConfigError, WorkerConfig, add_worker_flags, worker_config_from_args
from services.workers.media.config import DEFAULT_JOBS, JobLimits, add_job_flags, job_limits_from_args

KIND = "diffusers"
TASKS = ("auto", "text-to-image", "image-to-image", "text-to-video")
DTYPES = ("auto", "float32", "float16", "bfloat16")
# Call arguments the engine sets from each request: --pipeline-kwargs may not override them.
REQUEST_KWARGS = frozenset({"prompt", "negative_prompt", "height", "width", "num_inference_steps", "guidance_scale",
                            "generator", "image", "mask_image", "num_frames", "output_type", "callback_on_step_end",
                            "callback_on_step_end_tensor_inputs", "num_images_per_prompt", "latents",
                            "return_dict"})


@dataclasses.dataclass(frozen=True)
class DiffusersConfig:
    worker: WorkerConfig
    jobs: JobLimits = DEFAULT_JOBS
    task: str = "auto"
    device: str = "auto"  # auto: cuda when torch sees one, else cpu
    dtype: str = "auto"  # auto: float16 on a GPU, float32 on the CPU
    variant: str = ""  # a weights variant of the model dir ("fp16": diffusion_pytorch_model.fp16.safetensors)
    enable_model_cpu_offload: bool = False
    pipeline_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    threads: int = 0  # torch intra-op threads; 0 keeps torch's default (one per core)
    # Card limits; 0 = derived from the model (see the module docstring).
    default_width: int = 0
    default_height: int = 0
    max_width: int = 0
    max_height: int = 0
    size_multiple: int = 0
    default_steps: int = 30
    max_steps: int = 100
    max_n: int = 10
    default_frames: int = 0
    max_frames: int = 0
    default_fps: float = 8.0


def parse_config(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> DiffusersConfig:
    """Parses and validates; raises ConfigError listing every problem."""
    p = FlagParser(KIND, "A Hugging Face diffusers pipeline (text-to-image, image-to-image, text-to-video) "
                         "behind MediaService.GenerateMedia.", env)
    add_worker_flags(p)
    add_job_flags(p)
    p.add("--task", default="auto", choices=TASKS, help="what the pipeline serves (auto: from its class)")
    p.add("--device", default="auto", help="torch device: auto, cpu, cuda, cuda:1, mps, ...")
    p.add("--dtype", default="auto", choices=DTYPES, help="weights dtype (auto: float16 on a GPU, float32 on the CPU)")
    p.add("--variant", default="", help="weights variant to load (e.g. fp16)")
    p.add("--enable-model-cpu-offload", default=False, type=bool,
          help="keep the pipeline's models on the CPU and move each to the GPU while it runs (needs accelerate)")
    p.add("--pipeline-kwargs", default="{}", help="JSON object of extra pipeline call arguments (e.g. strength, eta)")
    p.add("--threads", default=0, type=int, help="torch intra-op threads (0 = torch's default, one per core)")
    p.add("--default-width", default=0, type=int, help="default image width (0: the model's sample size)")
    p.add("--default-height", default=0, type=int, help="default image height (0: the model's sample size)")
    p.add("--max-width", default=0, type=int, help="largest width accepted (0: twice the default)")
    p.add("--max-height", default=0, type=int, help="largest height accepted (0: twice the default)")
    p.add("--size-multiple", default=0, type=int, help="sizes must be multiples of this (0: max(8, VAE scale))")
    p.add("--default-steps", default=30, type=int, help="denoising steps when the client gives none")
    p.add("--max-steps", default=100, type=int, help="most denoising steps accepted")
    p.add("--max-n", default=10, type=int, help="most outputs per request")
    p.add("--default-frames", default=0, type=int, help="video frames when the client gives none (0: min(16, max))")
    p.add("--max-frames", default=0, type=int, help="most video frames (0: the motion adapter's length)")
    p.add("--default-fps", default=8.0, type=float, help="video frames per second when the client gives none")
    args = p.parse(argv)
    errors: list[str] = []
    context = args.context_length or (_prompt_limit(args.model_dir) if args.model_dir else 0)
    if args.model_dir and not context and Path(args.model_dir).is_dir():
        errors.append(f"--model-dir {args.model_dir!r} has no tokenizer/tokenizer_config.json with model_max_length: "
                      "give --context-length (the prompt tokens its text encoder reads)")
    try:
        kwargs = json.loads(args.pipeline_kwargs)
    except ValueError as e:
        errors.append(f"--pipeline-kwargs is not JSON: {e}")
        kwargs = {}
    if not isinstance(kwargs, dict):
        errors.append("--pipeline-kwargs must be a JSON object")
        kwargs = {}
    if taken := sorted(REQUEST_KWARGS & set(kwargs)):
        errors.append(f"--pipeline-kwargs may not set {', '.join(taken)}: each request sets them")
    cfg = DiffusersConfig(
        worker=worker_config_from_args(args, KIND, context_length=context or 1), jobs=job_limits_from_args(args),
        task=args.task, device=args.device, dtype=args.dtype, variant=args.variant,
        enable_model_cpu_offload=args.enable_model_cpu_offload, pipeline_kwargs=kwargs, threads=args.threads,
        default_width=args.default_width, default_height=args.default_height, max_width=args.max_width,
        max_height=args.max_height, size_multiple=args.size_multiple, default_steps=args.default_steps,
        max_steps=args.max_steps, max_n=args.max_n, default_frames=args.default_frames, max_frames=args.max_frames,
        default_fps=args.default_fps)
    errors += cfg.worker.validate() + cfg.jobs.validate() + _engine_errors(cfg)
    if errors:
        raise ConfigError(errors)
    return cfg


def _engine_errors(cfg: DiffusersConfig) -> list[str]:
    errors: list[str] = []
    if cfg.jobs.max_running > 1:  # the engine runs one job at a time: torch already uses every core
        errors.append("--max-running-jobs must be 1: one pipeline runs one job at a time")
    for flag in ("threads", "default_width", "default_height", "max_width", "max_height", "size_multiple",
                 "default_frames", "max_frames"):
        if getattr(cfg, flag) < 0:
            errors.append(f"--{flag.replace('_', '-')} must be >= 0")
    for flag in ("default_steps", "max_steps", "max_n"):
        if getattr(cfg, flag) < 1:
            errors.append(f"--{flag.replace('_', '-')} must be at least 1")
    if cfg.default_steps > cfg.max_steps:
        errors.append("--default-steps is above --max-steps")
    if cfg.default_fps <= 0:
        errors.append("--default-fps must be positive")
    if cfg.enable_model_cpu_offload and cfg.device == "cpu":
        errors.append("--enable-model-cpu-offload moves models to an accelerator; --device is cpu")
    return errors


def _prompt_limit(model_dir: str) -> int:
    """The tokenizer's model_max_length (CLIP: 77), the card's context length; 0 when the dir does not say."""
    path = Path(model_dir) / "tokenizer" / "tokenizer_config.json"
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("model_max_length", 0)
    except (OSError, ValueError):
        return 0
    # transformers writes a huge sentinel (1e30) for "no limit".
    return value if isinstance(value, int) and 0 < value < 1_000_000 else 0
