"""``VllmOmniEngine``: vLLM-Omni's ``AsyncOmni`` (its diffusion stage) behind ``MediaEngine``.

``AsyncOmni`` lives on an event loop of its own (a thread started with the engine): the glue's blocking
``generate`` submits one request per output (seed + i) to that loop and waits for it in short slices, so a
cancel is seen within ``POLL_S``: the request is then aborted through ``AsyncOmni.abort`` (what vLLM-Omni's
own server does for a client that hangs up), which sets the pipeline's cancellation signal; pipelines that
check it (``diffusion/cancellation.py``) stop at their next step, the others when the output is done.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from services.common.discovery import MediaLimits
from services.workers.media.engine import MediaEvent, MediaJob, Output, StepDone
from services.workers.vllm_omni.request import omni_prompt, output_frames, sampling_kwargs

log = logging.getLogger(__name__)

POLL_S = 0.05
ABORT_WAIT_S = 10.0


class VllmOmniEngine:
    def __init__(self, omni: Any, loop: asyncio.AbstractEventLoop, limits: MediaLimits,
                 count: Callable[[str], int], params: Callable[[MediaJob, int], Any]):
        self._omni = omni  # vllm_omni.AsyncOmni, created on ``loop``
        self._loop = loop
        self.limits = limits
        self._count = count
        self._params = params  # job, index -> the per-stage sampling params list for AsyncOmni.generate

    def count_tokens(self, prompt: str) -> int:
        return self._count(prompt)

    def generate(self, job: MediaJob, cancelled: threading.Event) -> Iterator[MediaEvent]:
        total = job.n * job.steps
        prompt = omni_prompt(job)
        for index in range(job.n):
            if cancelled.is_set():
                return
            request_id = f"meshfront-{uuid.uuid4().hex}-{index}"
            future = asyncio.run_coroutine_threadsafe(
                self._final_output(prompt, self._params(job, index), request_id), self._loop)
            result = self._wait(future, request_id, cancelled)
            if result is None:  # cancelled
                return
            if result.error:
                raise RuntimeError(f"vLLM-Omni: {result.error}")
            yield StepDone(step=(index + 1) * job.steps, total_steps=total)
            yield Output(index=index, frames=output_frames(list(result.images), job))

    async def _final_output(self, prompt: dict[str, Any], params: Any, request_id: str) -> Any:
        last = None
        async for output in self._omni.generate(prompt, request_id=request_id, sampling_params_list=params):
            last = output
        if last is None:
            raise RuntimeError("vLLM-Omni finished the request without an output")
        return last

    def _wait(self, future: concurrent.futures.Future, request_id: str, cancelled: threading.Event) -> Any:
        while True:
            try:
                return future.result(timeout=POLL_S)
            except concurrent.futures.TimeoutError:
                if cancelled.is_set():
                    future.cancel()  # closes AsyncOmni's generator on its loop
                    # Waited for (bounded): the glue frees the job's slot when this thread ends, and the
                    # GPU is free only once the orchestrator has dropped the request.
                    abort = asyncio.run_coroutine_threadsafe(self._omni.abort(request_id), self._loop)
                    try:
                        abort.result(timeout=ABORT_WAIT_S)
                    except concurrent.futures.TimeoutError:
                        log.warning("vLLM-Omni did not confirm the abort of %s within %.0f s", request_id,
                                    ABORT_WAIT_S)
                    return None

    def close(self) -> None:
        self._omni.shutdown()
        self._loop.call_soon_threadsafe(self._loop.stop)


def sampling_params_list(omni: Any) -> Callable[[MediaJob, int], Any]:
    """job, index -> every stage's sampling params, the diffusion stage's replaced by the job's, as vLLM-Omni's
    own server builds them (stage_params.build_stage_sampling_params_list). Imports vLLM-Omni."""
    from vllm_omni.entrypoints.openai.stage_params import (
        build_stage_sampling_params_list,
        get_default_sampling_params_list,
    )
    from vllm_omni.inputs.data import OmniDiffusionSamplingParams

    def build(job: MediaJob, index: int) -> Any:
        params = OmniDiffusionSamplingParams(**sampling_kwargs(job, index))
        return build_stage_sampling_params_list(list(omni.stage_configs), get_default_sampling_params_list(omni),
                                                diffusion_params=params, replace_diffusion_params=True)

    return build
