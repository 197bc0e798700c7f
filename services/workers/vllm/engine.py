"""vLLM's AsyncLLM behind Meshfront's ``Engine`` protocol (imports vllm: runs in an engine environment).

One ``generate`` is one vLLM request on token ids: DELTA outputs, no detokenization. vLLM's
output collector merges deltas while the consumer is busy, which is exactly the contract of
``services.workers.engine``: each output carries every token ready when asked. Closing the stream
closes vLLM's generator, whose GeneratorExit path aborts the request in the engine core (its KV
blocks are freed in the same step).

Load for the routers comes from vLLM's own scheduler stats (a stat logger fed every engine step);
the engine's death (its core process gone) resolves ``failed()`` so the worker deregisters at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Iterator
from typing import Any

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.exceptions import GracefulHTTPError, VLLMClientError
from vllm.inputs import TokensPrompt
from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError
from vllm.v1.metrics.loggers import StatLoggerBase

from services.workers.engine import (
    EngineBusy,
    EngineError,
    EngineOutput,
    EngineRequest,
    FinishReason,
    KvTransferFailed,
    RequestRejected,
    engine_token_ids,
)
from services.workers.vllm import lora, media, sampling, thinking_budget, transfer

log = logging.getLogger(__name__)

DEAD_POLL_S = 0.2


class SchedulerLoad:
    """The latest scheduler stats of the engine, as the routers' load message wants them."""

    def __init__(self) -> None:
        self.running = 0
        self.waiting = 0
        self.kv_usage = 0.0

    def stat_logger_factory(self):
        load = self

        class _Logger(StatLoggerBase):
            def __init__(self, vllm_config, engine_index: int = 0):
                pass

            def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
                if scheduler_stats is not None:
                    load.running = scheduler_stats.num_running_reqs
                    load.waiting = scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
                    load.kv_usage = scheduler_stats.kv_cache_usage

            def log_engine_initialized(self):
                pass

        return _Logger


class VllmEngine:
    """AsyncLLM in this process, its engine core in a child process (vLLM's own layout)."""

    def __init__(self, engine_args: AsyncEngineArgs):
        self.engine_args = engine_args
        self.load = SchedulerLoad()
        self._llm: AsyncLLM | None = None
        self._defaults: dict[str, Any] = {}
        self._thinking_budgets = False  # whether vLLM enforces max_thinking_tokens (thinking_budget.py)
        self.in_flight = 0

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._llm is not None:
            return
        # The constructor blocks while the core process loads the model (a minute on a CPU); in a
        # thread, the loop keeps answering (NATS, signals). The output handler starts lazily.
        llm = await asyncio.to_thread(AsyncLLM.from_engine_args, self.engine_args,
                                      stat_loggers=[self.load.stat_logger_factory()])
        self._defaults = llm.model_config.get_diff_sampling_param()
        self._thinking_budgets = thinking_budget.enforces(llm.vllm_config)
        self._llm = llm

    async def close(self) -> None:
        if self._llm is not None:
            llm, self._llm = self._llm, None
            await asyncio.to_thread(llm.shutdown)  # waits for the core process to exit

    @property
    def llm(self) -> AsyncLLM:
        if self._llm is None:
            raise RuntimeError("the vLLM engine is not started")
        return self._llm

    # What the engine really uses, for the worker's card (valid after start).
    @property
    def max_model_len(self) -> int:
        return self.llm.model_config.max_model_len

    @property
    def block_size(self) -> int:
        return self.llm.vllm_config.cache_config.block_size

    @property
    def num_kv_blocks(self) -> int:
        return self.llm.vllm_config.cache_config.num_gpu_blocks or 0

    @property
    def input_modalities(self) -> tuple[str, ...]:
        return media.input_modalities(self.llm.model_config)

    @property
    def max_num_batched_tokens(self) -> int:
        return self.llm.vllm_config.scheduler_config.max_num_batched_tokens

    def read_load(self) -> dict[str, int]:
        """The routers' load fields; an idle engine reports nothing running whatever the last step said."""
        idle = self.in_flight == 0
        total = self.num_kv_blocks
        return {"active_blocks": 0 if idle else round(self.load.kv_usage * total),
                "waiting": 0 if idle else self.load.waiting, "running": 0 if idle else self.load.running,
                "total_blocks": total}

    async def release_kv(self, kv_transfer_params: dict[str, Any]) -> None:
        """Frees the blocks a prefill engine holds for these parameters (a prefill leg's, returned to this decode
        engine's caller): vLLM's decode-side rejection of a transfer (transfer.py, "release")."""
        await self.llm.notify_kv_transfer_request_rejected(transfer.release_request_id(), kv_transfer_params)

    async def failed(self) -> BaseException:
        """Returns the engine's fatal error once its core process has died."""
        while True:
            llm = self._llm
            if llm is not None and llm.errored:
                return llm.dead_error
            await asyncio.sleep(DEAD_POLL_S)

    # -- generation ----------------------------------------------------------------------------------

    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        params = sampling_params(request, max_model_len=self.max_model_len, defaults=self._defaults,
                                 thinking_budgets=self._thinking_budgets)
        prompt = TokensPrompt(prompt_token_ids=list(request.token_ids))
        if request.media:  # decoded media and their uuids, placeholders collapsed (media.py); decoding is CPU work
            prompt["prompt_token_ids"] = engine_token_ids(request.token_ids, request.media)
            prompt.update(await asyncio.to_thread(media.multimodal_fields, request.media))
        eos = request.eos_token_ids
        top = request.logprobs
        leg = transfer.leg(request.kv_transfer_params)
        self.in_flight += 1
        first = True
        try:
            async with contextlib.aclosing(self.llm.generate(prompt, params, request.request_id,
                                                             lora_request=lora.lora_request(request.lora))) as stream:
                while True:
                    with vllm_errors():
                        out = await anext(stream, None)
                    if out is None:
                        return
                    completion = out.outputs[0]
                    ids = list(completion.token_ids)
                    result = EngineOutput(ids, sampling.finish_reason(completion.finish_reason,
                                                                      completion.stop_reason, eos))
                    if result.finish_reason == FinishReason.ERROR:
                        if leg is transfer.Leg.DECODE:  # vLLM's kv_load_failure_policy "fail"
                            raise KvTransferFailed("vLLM could not load the prompt's KV blocks from the "
                                                   "prefill worker")
                        raise EngineError(f"vLLM finished the request with {completion.finish_reason!r}")
                    if leg is transfer.Leg.PREFILL and result.finish_reason != FinishReason.NONE:
                        result.kv_transfer_params = transfer.returned_params(out.kv_transfer_params)
                    if top is not None and ids:
                        result.logprobs = sampling.token_logprobs(ids, completion.logprobs, top)
                    if first:
                        result.prompt_tokens = len(request.token_ids)
                        result.cached_tokens = out.num_cached_tokens or 0
                        first = False
                    yield result
        finally:
            self.in_flight -= 1


def sampling_params(request: EngineRequest, *, max_model_len: int, defaults: dict[str, Any],
                    thinking_budgets: bool = False) -> SamplingParams:
    """vLLM's own SamplingParams for ``request``; what vLLM's validation refuses is the client's fault."""
    kwargs = sampling.sampling_kwargs(request, max_model_len=max_model_len, defaults=defaults,
                                      thinking_budgets=thinking_budgets)
    structured = kwargs.pop("structured_outputs", None)
    try:
        if structured is not None:
            kwargs["structured_outputs"] = StructuredOutputsParams(**structured)
        return SamplingParams(**kwargs, output_kind=RequestOutputKind.DELTA)
    except (VLLMClientError, ValueError) as e:
        raise RequestRejected(str(e)) from e


@contextlib.contextmanager
def vllm_errors() -> Iterator[None]:
    """vLLM's exceptions as the worker glue's: the client's fault, overload, or an engine failure."""
    try:
        yield
    except VLLMClientError as e:
        raise RequestRejected(str(e)) from e
    except GracefulHTTPError as e:  # admission control: the queue is full
        raise EngineBusy(str(e)) from e
    except EngineDeadError as e:
        raise EngineError("the vLLM engine died") from e
    except ValueError as e:  # vLLM still validates some inputs with plain ValueErrors
        raise RequestRejected(str(e)) from e
