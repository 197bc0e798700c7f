"""Loading a diffusers pipeline for the worker: the task it serves, where it runs, and the card's limits.

``load_pipelines`` reads ``--model-dir`` with ``DiffusionPipeline.from_pretrained`` (local files only: a
worker never reaches a model hub), tells the task from the pipeline's class (``--task auto``), and, for
an image model, derives the image-to-image and inpainting pipelines from the same components with
diffusers' ``AutoPipelineFor*.from_pipe`` (no second copy of the weights). torch and diffusers are
imported here, never by the rest of the mesh.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
from typing import Any

from services.common.discovery import MediaLimits
from services.workers.diffusers.config import DiffusersConfig

log = logging.getLogger(__name__)

TEXT_TO_IMAGE, IMAGE_TO_IMAGE, TEXT_TO_VIDEO = "text-to-image", "image-to-image", "text-to-video"
# Video pipelines whose __call__ takes prompt, height, width, num_frames and callback_on_step_end and
# returns ``.frames`` (diffusers has no auto mapping for video to read this from).
VIDEO_PIPELINES = frozenset({"AnimateDiffPipeline", "AnimateDiffSDXLPipeline", "WanPipeline", "LTXPipeline",
                             "CogVideoXPipeline", "HunyuanVideoPipeline", "MochiPipeline", "LattePipeline",
                             "AllegroPipeline", "SanaVideoPipeline", "EasyAnimatePipeline"})
IMAGE_FORMATS = ("png", "jpeg", "webp")
VIDEO_FORMATS = ("mp4", "mjpeg")


class PipelineError(ValueError):
    """The model dir or the engine flags cannot make a serving pipeline (a bad value at start)."""


@dataclasses.dataclass
class Pipelines:
    """The loaded pipeline and what was derived from it, on their device."""

    task: str
    main: Any  # text-to-image, image-to-image or text-to-video, per ``task``
    image_to_image: Any | None  # serves a job with an input image (None: the model takes none)
    inpaint: Any | None  # serves a job with a mask (None: masks are refused)
    device: str


def resolve_device(requested: str) -> str:
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(requested)
    except RuntimeError as e:
        raise PipelineError(f"--device {requested!r}: {e}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise PipelineError(f"--device {requested}: torch sees no CUDA device")
    return requested


def resolve_dtype(requested: str, device: str) -> Any:
    import torch

    if requested == "auto":
        return torch.float32 if device == "cpu" else torch.float16
    return getattr(torch, requested)  # one of config.DTYPES, all torch attributes


def check_offload(cfg: DiffusersConfig) -> None:
    if cfg.enable_model_cpu_offload and importlib.util.find_spec("accelerate") is None:
        raise PipelineError("--enable-model-cpu-offload needs the accelerate package (pip install accelerate)")


def load_pipelines(cfg: DiffusersConfig) -> Pipelines:
    """Loads the model dir onto its device (seconds to minutes: before the port opens)."""
    import torch
    from diffusers import (
        AutoPipelineForImage2Image,
        AutoPipelineForInpainting,
        AutoPipelineForText2Image,
        DiffusionPipeline,
    )
    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.disable_progress_bar()
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    kwargs: dict[str, Any] = {"local_files_only": True, "dtype": dtype}
    if cfg.variant:
        kwargs["variant"] = cfg.variant
    try:
        pipe = DiffusionPipeline.from_pretrained(cfg.worker.model_dir, **kwargs)
    except (OSError, ValueError) as e:
        raise PipelineError(f"--model-dir {cfg.worker.model_dir!r} is not a diffusers pipeline: {e}") from None
    task = pipeline_task(pipe) if cfg.task == "auto" else cfg.task
    image_to_image = inpaint = None
    if task == TEXT_TO_VIDEO:
        if type(pipe).__name__ not in VIDEO_PIPELINES:
            raise PipelineError(f"--task text-to-video: {type(pipe).__name__} is not a video pipeline this worker "
                                f"knows ({', '.join(sorted(VIDEO_PIPELINES))})")
    else:
        # A forced task over another class (an img2img dir served as text-to-image): the same components.
        auto = AutoPipelineForText2Image if task == TEXT_TO_IMAGE else AutoPipelineForImage2Image
        if type(pipe) not in auto_classes(auto):
            pipe = _derive(auto, pipe, task)
        image_to_image = pipe if task == IMAGE_TO_IMAGE else _derive_or_none(AutoPipelineForImage2Image, pipe)
        inpaint = _derive_or_none(AutoPipelineForInpainting, pipe)
    pipelines = [p for p in {id(p): p for p in (pipe, image_to_image, inpaint) if p is not None}.values()]
    for p in pipelines:
        p.set_progress_bar_config(disable=True)
        if cfg.enable_model_cpu_offload:
            p.enable_model_cpu_offload(device=device)
        else:
            p.to(device)
    log.info("loaded %s (%s, task %s) on %s as %s; image input: %s, masks: %s", cfg.worker.model_dir,
             type(pipe).__name__, task, device, str(dtype).removeprefix("torch."),
             image_to_image is not None, inpaint is not None)
    return Pipelines(task=task, main=pipe, image_to_image=image_to_image, inpaint=inpaint, device=device)


def auto_classes(auto: Any) -> set[type]:
    """The pipeline classes one of diffusers' ``AutoPipelineFor*`` makes (its own table)."""
    from diffusers.pipelines import auto_pipeline

    table = {"AutoPipelineForText2Image": auto_pipeline.AUTO_TEXT2IMAGE_PIPELINES_MAPPING,
             "AutoPipelineForImage2Image": auto_pipeline.AUTO_IMAGE2IMAGE_PIPELINES_MAPPING,
             "AutoPipelineForInpainting": auto_pipeline.AUTO_INPAINT_PIPELINES_MAPPING}[auto.__name__]
    return set(table.values())


def pipeline_task(pipe: Any) -> str:
    """The task a pipeline class serves (``--task auto``), from diffusers' auto-pipeline tables."""
    from diffusers import AutoPipelineForImage2Image, AutoPipelineForInpainting, AutoPipelineForText2Image

    cls = type(pipe)
    if cls.__name__ in VIDEO_PIPELINES:
        return TEXT_TO_VIDEO
    if cls in auto_classes(AutoPipelineForText2Image):
        return TEXT_TO_IMAGE
    if cls in auto_classes(AutoPipelineForImage2Image) | auto_classes(AutoPipelineForInpainting):
        return IMAGE_TO_IMAGE
    raise PipelineError(f"cannot tell what {cls.__name__} serves: give --task")


def _derive(auto: Any, pipe: Any, task: str) -> Any:
    try:
        return auto.from_pipe(pipe)
    except ValueError as e:
        raise PipelineError(f"--task {task}: diffusers has no {task} pipeline for {type(pipe).__name__} "
                            f"({e})") from None


def _derive_or_none(auto: Any, pipe: Any) -> Any | None:
    """``auto.from_pipe(pipe)``, or None when diffusers has no such pipeline for the family."""
    try:
        return auto.from_pipe(pipe)
    except ValueError as e:  # diffusers: "AutoPipeline can't find a pipeline linked to X for None"
        log.info("%s: %s", auto.__name__, e)
        return None


def derive_limits(cfg: DiffusersConfig, pipelines: Pipelines) -> MediaLimits:
    """The card's limits: the flags, and what they leave at 0 derived from the model."""
    pipe = pipelines.main
    scale = int(pipe.vae_scale_factor)
    sample = _sample_size(pipe)
    width = cfg.default_width or (sample[1] * scale if sample else 0)
    height = cfg.default_height or (sample[0] * scale if sample else 0)
    if not width or not height:
        raise PipelineError(f"{type(pipe).__name__} does not say its sample size: give --default-width and "
                            "--default-height")
    multiple = cfg.size_multiple or max(8, scale)
    video = pipelines.task == TEXT_TO_VIDEO
    max_frames = default_frames = 0
    if video:
        max_frames = cfg.max_frames or _motion_length(pipe)
        if not max_frames:
            raise PipelineError(f"{type(pipe).__name__} does not say how many frames it takes: give --max-frames")
        default_frames = cfg.default_frames or min(16, max_frames)
        if default_frames > max_frames:
            raise PipelineError(f"--default-frames {default_frames} is above --max-frames {max_frames}")
    return MediaLimits(
        max_width=cfg.max_width or 2 * width, max_height=cfg.max_height or 2 * height, size_multiple=multiple,
        default_width=width, default_height=height, max_n=cfg.max_n, default_steps=cfg.default_steps,
        max_steps=cfg.max_steps, output_formats=VIDEO_FORMATS if video else IMAGE_FORMATS,
        default_fps=cfg.default_fps if video else 0.0, max_frames=max_frames, default_frames=default_frames,
        takes_image=pipelines.image_to_image is not None)


def _sample_size(pipe: Any) -> tuple[int, int] | None:
    """The denoiser's latent (height, width): a UNet's or a transformer's ``sample_size``."""
    components = pipe.components
    denoiser = components.get("unet") or components.get("transformer")
    if denoiser is None:
        return None
    size = denoiser.config.get("sample_size")
    if isinstance(size, int):
        return size, size
    if isinstance(size, (list, tuple)) and len(size) == 2:
        return int(size[0]), int(size[1])
    return None


def _motion_length(pipe: Any) -> int:
    adapter = pipe.components.get("motion_adapter")
    return int(adapter.config.motion_max_seq_length) if adapter is not None else 0
