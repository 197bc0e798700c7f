"""``MediaEngine`` over a diffusers pipeline: one job at a time, outputs one after another.

Determinism: output i is denoised from a CPU ``torch.Generator`` seeded with seed + i, alone in its
pipeline call, so the same job gives the same pixels on the same device, and output i of a request is
the same image whatever ``n`` is. (Batching the n outputs into one call would be faster on a GPU, but
torch's results depend on the batch size.) The generator lives on the CPU even for a GPU pipeline:
diffusers draws the noise there and moves it, so the noise does not depend on the device.

Progress, previews and cancelling use diffusers' ``callback_on_step_end``, called after every
denoising step: it reports ``StepDone``, decodes a preview at the chosen steps, and raises once
``cancelled`` is set, which ends the pipeline call there (no final VAE decode, which is the slow part
of a video). Raising works for every pipeline that takes the callback; diffusers' ``_interrupt`` would
still run the remaining loop iterations and the decode.

The pipeline runs in the engine's own thread while ``generate`` (itself in a thread of the glue's)
yields what the callback queued: the events reach the client while the step loop runs.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import queue
import threading
from collections.abc import Iterator
from typing import Any

from PIL import Image

from services.common.discovery import MediaLimits
from services.common.errors import InvalidRequest
from services.workers.diffusers.pipeline import TEXT_TO_VIDEO, Pipelines
from services.workers.media.engine import MediaEvent, MediaJob, Output, Preview, StepDone

log = logging.getLogger(__name__)

SEED_MODULUS = 2**64  # the proto's seed is a uint64; seed + i wraps
_DONE = object()  # the pipeline call returned (its result follows in the future)


class _Stop(Exception):
    """Raised from the step callback to end a pipeline call whose job was cancelled."""


class DiffusersEngine:
    """Implements ``services.workers.media.engine.MediaEngine`` over loaded ``Pipelines``."""

    def __init__(self, pipelines: Pipelines, limits: MediaLimits, pipeline_kwargs: dict[str, Any] | None = None):
        self.pipelines = pipelines
        self.limits = limits
        self.pipeline_kwargs = dict(pipeline_kwargs or {})
        self._video = pipelines.task == TEXT_TO_VIDEO
        # torch already uses every core for one job: jobs queue here, in arrival order.
        self._job_lock = threading.Lock()
        self._runner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="diffusers")
        self._tokenizer = pipelines.main.components.get("tokenizer")
        self._preview_decoder = _preview_decoder(pipelines.main)

    def close(self) -> None:
        self._runner.shutdown(wait=True, cancel_futures=True)

    def count_tokens(self, prompt: str) -> int:
        """Prompt tokens as the (first) text encoder reads them: truncated at its length, specials included."""
        if self._tokenizer is None:
            return 0
        return len(self._tokenizer(prompt, truncation=True, max_length=self._tokenizer.model_max_length).input_ids)

    def generate(self, job: MediaJob, cancelled: threading.Event) -> Iterator[MediaEvent]:
        pipe, inputs = self._pipeline_for(job)
        while not self._job_lock.acquire(timeout=0.05):  # a job cancelled while it waits leaves the queue
            if cancelled.is_set():
                return
        try:
            for index in range(job.n):
                if cancelled.is_set():
                    return
                yield from self._one(pipe, job, inputs, index, cancelled)
        finally:
            self._job_lock.release()

    def _pipeline_for(self, job: MediaJob) -> tuple[Any, dict[str, Any]]:
        """The pipeline for the job and its call arguments other than the prompt, seed and callback."""
        size = (job.width, job.height)
        # The glue checked the job against the card (kind, sizes, takes_image, a mask's alpha and size);
        # what is left is what the card cannot say.
        if self._video:
            return self.pipelines.main, {"height": job.height, "width": job.width, "num_frames": job.num_frames}
        if job.mask is not None and job.input_image is not None:  # the glue sends no mask without its image
            if self.pipelines.inpaint is None:
                raise InvalidRequest("this model cannot edit with a mask: diffusers has no inpainting pipeline "
                                     "for it", param="mask")
            return self.pipelines.inpaint, {"image": _rgb(job.input_image, size),
                                            "mask_image": _paint_mask(job.mask, size),
                                            "height": job.height, "width": job.width}
        if job.input_image is not None:  # takes_image on the card: image_to_image is set
            # The img2img pipelines take the output size from the image: resize it to the size asked for.
            return self.pipelines.image_to_image, {"image": _rgb(job.input_image, size)}
        if self.pipelines.task != "text-to-image":
            raise InvalidRequest("this model needs an input image (image-to-image)", param="input_image")
        return self.pipelines.main, {"height": job.height, "width": job.width}

    def _one(self, pipe: Any, job: MediaJob, inputs: dict[str, Any], index: int,
             cancelled: threading.Event) -> Iterator[MediaEvent]:
        """Output ``index``: its steps, previews and frames, as the pipeline call produces them."""
        import torch

        events: queue.Queue[Any] = queue.Queue()
        stop = threading.Event()  # the consumer went away (the glue closed the generator)

        def on_step_end(p: Any, step: int, timestep: Any, tensors: dict[str, Any]) -> dict[str, Any]:
            if cancelled.is_set() or stop.is_set():
                raise _Stop
            total = p.num_timesteps
            events.put(StepDone(step=index * total + step + 1, total_steps=job.n * total))
            previews = preview_steps(total, job.partial_images) if self._preview_decoder else {}
            if step in previews:
                events.put(Preview(index=index, partial_index=previews[step],
                                   image=self._preview_decoder(tensors["latents"])))
            return tensors

        kwargs: dict[str, Any] = {
            **self.pipeline_kwargs, **inputs, "prompt": job.prompt,
            "negative_prompt": job.negative_prompt or None, "num_inference_steps": job.steps,
            "generator": torch.Generator("cpu").manual_seed((job.seed + index) % SEED_MODULUS),
            "output_type": "pil", "callback_on_step_end": on_step_end}
        if job.guidance_scale is not None:
            kwargs["guidance_scale"] = job.guidance_scale

        def call() -> Any:
            try:
                return pipe(**kwargs)
            finally:
                events.put(_DONE)

        future = self._runner.submit(call)
        try:
            while (event := events.get()) is not _DONE:
                yield event
            try:
                result = future.result()
            except _Stop:
                log.info("output %d stopped between denoising steps: the request was cancelled", index)
                return
            frames = list(result.frames[0]) if self._video else [result.images[0]]
            yield Output(index=index, frames=frames)
        finally:
            stop.set()
            # One job at a time: the lock is released only once the pipeline really stopped.
            concurrent.futures.wait([future])


def preview_steps(total: int, partial_images: int) -> dict[int, int]:
    """Step index (0-based) after which each preview is decoded -> its partial index, evenly spread.

    Fewer than asked when the steps are fewer than the previews (OpenAI: "up to" partial_images).
    """
    chosen = sorted({max(0, math.ceil((k + 1) * total / (partial_images + 1)) - 1) for k in range(partial_images)})
    return {step: i for i, step in enumerate(chosen)}


def _preview_decoder(pipe: Any) -> Any:
    """A function latents -> PIL image through the pipeline's VAE (the first frame of a video), or None
    for a VAE this worker does not know how to call on one frame (those models stream no previews)."""
    import torch
    from diffusers import AutoencoderKL
    from diffusers.image_processor import VaeImageProcessor

    if not isinstance(pipe.components.get("vae"), AutoencoderKL):
        return None
    vae: Any = pipe.components["vae"]  # Any: mypy cannot see diffusers' model attributes
    processor = VaeImageProcessor(vae_scale_factor=pipe.vae_scale_factor)

    @torch.no_grad()
    def decode(latents: Any) -> Image.Image:
        first = latents[:1]
        if first.ndim == 5:  # (batch, channels, frames, height, width): a video's first frame
            first = first[:, :, 0]
        first = first.to(device=vae.device, dtype=vae.dtype) / vae.config.scaling_factor
        return processor.postprocess(vae.decode(first, return_dict=False)[0], output_type="pil")[0]

    return decode


def _rgb(image: Image.Image, size: tuple[int, int]) -> Image.Image:
    image = image.convert("RGB")
    return image if image.size == size else image.resize(size, Image.Resampling.LANCZOS)


def _paint_mask(mask: Image.Image, size: tuple[int, int]) -> Image.Image:
    """OpenAI's mask (RGBA, transparent where to paint) as diffusers' (white where to paint)."""
    paint = mask.getchannel("A").point(lambda a: 255 - a)
    return paint if paint.size == size else paint.resize(size, Image.Resampling.NEAREST)
