"""Pure: a ``MediaJob`` -> the keyword arguments of SGLang's ``DiffGenerator.generate`` (one output per call),
and what it returns -> PIL frames. No sglang import here (tests/unit run it without SGLang); the names are
checked against SGLang's own ``SamplingParams`` in tests/engine_env/sglang.

SGLang (0.5.23, ``sglang.multimodal_gen``) builds its ``SamplingParams`` from these kwargs over the model's
own defaults (``SamplingParams.from_user_sampling_params_args``): only the fields named here override the
model's, so an unset guidance scale or negative prompt keeps the model's default, as in SGLang's server.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image

from services.workers.media.engine import MediaJob


def sampling_kwargs(job: MediaJob, index: int, image_path: str | None) -> dict[str, Any]:
    """Output ``index`` of ``job``: one prompt, one output, seed + index (the mesh's seed rule)."""
    kwargs: dict[str, Any] = {
        "prompt": job.prompt,
        "width": job.width,
        "height": job.height,
        "num_inference_steps": job.steps,
        "seed": job.seed + index,
        "num_outputs_per_prompt": 1,
        # Frames back in memory as uint8 arrays; SGLang writes no file and encodes nothing (the glue does).
        "save_output": False,
        "return_file_paths_only": False,
        "return_frames": True,
    }
    if job.negative_prompt:
        kwargs["negative_prompt"] = job.negative_prompt
    if job.guidance_scale is not None:
        kwargs["guidance_scale"] = job.guidance_scale
    if job.kind == "video":
        kwargs["num_frames"] = job.num_frames
        kwargs["fps"] = max(1, round(job.fps))  # SGLang's fps is an int (conditioning, its own encoder)
    else:
        kwargs["num_frames"] = 1
    if image_path is not None:
        kwargs["image_path"] = image_path  # SGLang reads input images from paths (or URLs)
    return kwargs


def output_frames(frames: list[Any], job: MediaJob) -> list[Image.Image]:
    """SGLang's frames (HWC uint8 arrays, ``GenerationResult.frames``) as the job's PIL frames.

    A video model may make more frames than asked: SGLang rounds the count up to what its VAE's temporal
    stride (and the GPU count) allows. The first ``num_frames`` are the clip asked for; fewer is an error.
    """
    wanted = job.num_frames if job.kind == "video" else 1
    if len(frames) < wanted:
        raise RuntimeError(f"SGLang made {len(frames)} frames where {wanted} were asked for")
    return [_to_pil(frame) for frame in frames[:wanted]]


def _to_pil(frame: Any) -> Image.Image:
    array = np.asarray(frame)
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] not in (1, 3, 4):
        raise RuntimeError(f"SGLang frame of shape {array.shape} and type {array.dtype}: expected HWC uint8")
    if array.shape[2] == 1:
        array = array[:, :, 0]
    return Image.fromarray(array).convert("RGB")
