"""Pure: a ``MediaJob`` -> vLLM-Omni's prompt (an ``OmniTextPrompt`` dict) and the keyword arguments of its
``OmniDiffusionSamplingParams`` (one output per request), and its outputs -> PIL frames. No vllm_omni import
here (tests/unit run it without vLLM-Omni); the names are checked against vLLM-Omni 0.30.0's own classes in
tests/engine_env/vllm_omni.

The mapping follows vLLM-Omni's own OpenAI server (``entrypoints/openai/api_server.py`` for images,
``serving_video.py`` for videos): the negative prompt and input images ride on the prompt; size, steps,
guidance, seed, frames and fps on the sampling params, each set only when given so the pipeline's own
default applies otherwise.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image

from services.workers.media.engine import MediaJob


def omni_prompt(job: MediaJob) -> dict[str, Any]:
    prompt: dict[str, Any] = {"prompt": job.prompt, "modalities": [job.kind]}
    if job.negative_prompt:
        prompt["negative_prompt"] = job.negative_prompt
    media: dict[str, Any] = {}
    if job.input_image is not None:
        media["image"] = job.input_image  # an edit's source, image-to-image, a video's first frame
    if job.mask is not None:
        media["mask_image"] = job.mask
    if media:
        prompt["multi_modal_data"] = media
    return prompt


def sampling_kwargs(job: MediaJob, index: int) -> dict[str, Any]:
    """Output ``index``: one output per request, seed + index (the mesh's seed rule)."""
    kwargs: dict[str, Any] = {"num_outputs_per_prompt": 1, "seed": job.seed + index, "width": job.width,
                              "height": job.height, "num_inference_steps": job.steps}
    if job.guidance_scale is not None:
        kwargs["guidance_scale"] = job.guidance_scale  # vLLM-Omni marks it provided itself (OmniDiffusionRequest)
    if job.kind == "video":
        kwargs["num_frames"] = job.num_frames
        kwargs["fps"] = job.fps
        kwargs["frame_rate"] = job.fps  # what the model conditions on, as vLLM-Omni's video server sets it
    return kwargs


def output_frames(images: list[Any], job: MediaJob) -> list[Image.Image]:
    """``OmniRequestOutput.images`` of one request as the job's PIL frames.

    Images: one PIL image. Videos: what the pipeline returned, in any of the shapes vLLM-Omni's video
    server accepts: a list of PIL frames or arrays, or one array/tensor (F,H,W,C), (F,C,H,W) or (C,F,H,W),
    optionally batched (1,...), floats in [0, 1] or [-1, 1], or uint8.
    """
    if job.kind == "image":
        if len(images) != 1:
            raise RuntimeError(f"vLLM-Omni returned {len(images)} images for one output")
        return [_image(images[0])]
    payload: Any = images[0] if len(images) == 1 else images
    frames = _video_frames(payload)
    if len(frames) < job.num_frames:
        raise RuntimeError(f"vLLM-Omni made {len(frames)} frames where {job.num_frames} were asked for")
    # A model may round the count up to its VAE's temporal stride: the first num_frames are the clip.
    return frames[:job.num_frames]


def _video_frames(payload: Any) -> list[Image.Image]:
    if isinstance(payload, list):
        if payload and not isinstance(payload[0], Image.Image) and _array(payload[0]).ndim >= 4:
            raise RuntimeError(f"vLLM-Omni returned {len(payload)} videos for one output")
        return [_image(frame) for frame in payload]
    array = _array(payload)
    if array.ndim == 5:
        if array.shape[0] != 1:
            raise RuntimeError(f"vLLM-Omni returned {array.shape[0]} videos for one output")
        array = array[0]
    if array.ndim != 4:
        raise RuntimeError(f"vLLM-Omni video of shape {array.shape}: expected 4 dimensions")
    if array.shape[-1] not in (1, 3, 4):
        if array.shape[0] in (1, 3, 4):  # (C, F, H, W)
            array = np.transpose(array, (1, 2, 3, 0))
        elif array.shape[1] in (1, 3, 4):  # (F, C, H, W)
            array = np.transpose(array, (0, 2, 3, 1))
        else:
            raise RuntimeError(f"vLLM-Omni video of shape {array.shape}: no channel axis")
    return [_from_hwc(frame) for frame in _to_uint8(array)]


def _image(item: Any) -> Image.Image:
    if isinstance(item, Image.Image):
        return item.convert("RGB")
    array = _array(item)
    if array.ndim == 3 and array.shape[-1] not in (1, 3, 4) and array.shape[0] in (1, 3, 4):
        array = np.transpose(array, (1, 2, 0))
    if array.ndim != 3:
        raise RuntimeError(f"vLLM-Omni frame of shape {array.shape}: expected an image")
    return _from_hwc(_to_uint8(array))


def _array(item: Any) -> np.ndarray:
    if hasattr(item, "detach"):  # a torch tensor (bf16 has no numpy dtype: go through float32)
        return item.detach().float().cpu().numpy()
    return np.asarray(item)


def _to_uint8(array: np.ndarray) -> np.ndarray:
    if array.dtype == np.uint8:
        return array
    if not np.issubdtype(array.dtype, np.floating):
        raise RuntimeError(f"vLLM-Omni pixels of type {array.dtype}: expected floats or uint8")
    if array.size and array.min() < 0.0:  # [-1, 1], as vLLM-Omni's own encoder reads it
        array = array * 0.5 + 0.5
    return (np.clip(array, 0.0, 1.0) * 255.0).round().astype(np.uint8)


def _from_hwc(array: np.ndarray) -> Image.Image:
    if array.shape[-1] == 1:
        array = array[:, :, 0]
    return Image.fromarray(np.ascontiguousarray(array)).convert("RGB")
