"""``SglangDiffusionEngine``: SGLang's ``DiffGenerator`` (sglang.multimodal_gen) behind ``MediaEngine``.

One ``DiffGenerator.generate`` call per output (seed + i), so outputs come one at a time, each followed by
its steps. SGLang 0.5.23 has no way to stop a request once its scheduler has it (no abort request in
``sglang.multimodal_gen``; its HTTP server cannot cancel either), so a cancel takes effect between
outputs: the output being denoised finishes, nothing after it starts, and nothing more is yielded.
Calls are serialized: the generator's scheduler client is one ZMQ socket.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from services.common.discovery import MediaLimits
from services.common.errors import InvalidRequest
from services.workers.media.engine import MediaEvent, MediaJob, Output, StepDone
from services.workers.sglang_diffusion.request import output_frames, sampling_kwargs


class SglangDiffusionEngine:
    def __init__(self, generator: Any, limits: MediaLimits, count: Callable[[str], int]):
        self._generator = generator  # sglang.multimodal_gen.DiffGenerator (or a test's stand-in)
        self.limits = limits
        self._count = count
        self._lock = threading.Lock()

    def count_tokens(self, prompt: str) -> int:
        return self._count(prompt)

    def generate(self, job: MediaJob, cancelled: threading.Event) -> Iterator[MediaEvent]:
        if job.mask is not None:
            raise InvalidRequest("this model does not take a mask: SGLang's diffusion serving has no "
                                 "inpainting input", param="mask")
        total = job.n * job.steps
        with tempfile.TemporaryDirectory(prefix="meshfront-sglang-diffusion-") as tmp:
            image_path = None
            if job.input_image is not None:
                image_path = str(Path(tmp) / "input.png")
                job.input_image.save(image_path)
            for index in range(job.n):
                if cancelled.is_set():
                    return
                with self._lock:
                    result = self._generator.generate(sampling_params_kwargs=sampling_kwargs(job, index, image_path))
                if cancelled.is_set():
                    return
                yield StepDone(step=(index + 1) * job.steps, total_steps=total)
                yield Output(index=index, frames=output_frames(_one(result).frames, job))

    def close(self) -> None:
        self._generator.shutdown()


def _one(result: Any) -> Any:
    """DiffGenerator.generate's answer for one prompt and one output: a GenerationResult. It logs and
    returns None when the request failed (the reason is in SGLang's log just above)."""
    if result is None:
        raise RuntimeError("SGLang generated nothing (its log above has the reason)")
    if isinstance(result, list):
        raise TypeError(f"SGLang returned {len(result)} results for one output (a layered model?)")
    return result
