"""vLLM's AsyncLLM behind Meshfront's ``Engine`` protocol (imports vllm: runs in an engine environment).

One ``generate`` is one vLLM request on token ids: DELTA outputs, no detokenization. vLLM's
output collector merges deltas while the consumer is busy, which is exactly the contract of
``services.workers.engine``: each output carries every token ready when asked. Closing the stream
closes vLLM's generator, whose GeneratorExit path aborts the request in the engine core (its KV
blocks are freed in the same step).

Load for the routers comes from vLLM's own scheduler stats (a stat logger fed every engine step);
the engine's death (its core process gone) resolves ``failed()`` so the worker deregisters at once.

With ``--data-parallel-size`` vLLM runs one engine core per rank behind the one AsyncLLM: a request sent to a
rank (``EngineRequest.dp_rank``, the router's choice) runs on that core (``generate``'s ``data_parallel_rank``,
the core's index among this client's), and each rank's load comes from its own core's stats.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import Any

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.exceptions import GracefulHTTPError, VLLMClientError
from vllm.inputs import TokensPrompt
from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError
from vllm.v1.metrics.loggers import StatLoggerBase

from services.common.dp_ranks import ranks_of
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
from services.workers.engine_ranks import RankInFlight
from services.workers.vllm import lora, media, sampling, thinking_budget, transfer

log = logging.getLogger(__name__)

# How often the death watch looks at AsyncLLM's ``errored``: a dead core's requests fail at once anyway (the output
# handler raises), so this only bounds how long its card stays, well inside the discovery TTL (6 s); each look is a
# wake-up of an otherwise idle worker.
DEAD_POLL_S = 1.0


class RankLoad:
    """The latest scheduler stats of one engine core, as the routers' load message wants them."""

    def __init__(self) -> None:
        self.running = 0
        self.waiting = 0
        self.kv_usage = 0.0


class SchedulerLoad:
    """Each engine core's latest scheduler stats, by its data-parallel rank (0 for an engine without ranks)."""

    def __init__(self) -> None:
        self.ranks: dict[int, RankLoad] = {}
        # Told of every change (the publishers' ``load_changed``), so that nothing polls the load of an idle engine.
        self.listeners: list[Callable[[], None]] = []

    def of(self, rank: int) -> RankLoad:
        return self.ranks.setdefault(rank, RankLoad())

    def moved(self) -> None:
        for listener in self.listeners:
            listener()

    def stat_logger_factory(self):
        load = self

        class _Logger(StatLoggerBase):
            # vLLM makes one per engine core, with the core's rank (its PerEngineStatLoggerAdapter).
            def __init__(self, vllm_config, engine_index: int = 0):
                self._rank = load.of(engine_index)

            def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
                if scheduler_stats is not None:
                    rank = self._rank
                    running = scheduler_stats.num_running_reqs
                    waiting = scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
                    kv_usage = scheduler_stats.kv_cache_usage
                    if (running, waiting, kv_usage) != (rank.running, rank.waiting, rank.kv_usage):
                        rank.running, rank.waiting, rank.kv_usage = running, waiting, kv_usage
                        load.moved()

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
        self.in_flight = RankInFlight()

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
        """One engine core's (vLLM sums its cores' in the config)."""
        return (self.llm.vllm_config.cache_config.num_gpu_blocks or 0) // len(self.dp_ranks)

    @property
    def dp_ranks(self) -> range:
        """The data-parallel ranks of the engine cores this client drives, as vLLM's MPClient counts them: every
        rank under its internal load balancing, this node's under hybrid or external load balancing."""
        pc = self.llm.vllm_config.parallel_config
        count = pc.data_parallel_size_local if pc.local_engines_only else pc.data_parallel_size
        return range(pc.data_parallel_index, pc.data_parallel_index + count)

    @property
    def has_ranks(self) -> bool:
        ranks = self.dp_ranks
        return ranks_of(ranks.start, len(ranks)) is not None

    def engine_index(self, dp_rank: int | None) -> int | None:
        """vLLM's ``data_parallel_rank`` for a request sent to ``dp_rank``: the core's index among this client's
        (None: vLLM's own balancing picks one, or there is one core). A rank the worker lacks is the caller's
        mistake, named as ``dp_rank``."""
        if dp_rank is None or not self.has_ranks:
            return None  # a worker without ranks is rank 0 to the router, which sends no rank to it
        ranks = self.dp_ranks
        if dp_rank not in ranks:
            raise RequestRejected(f"this worker has no data-parallel rank {dp_rank} (its ranks: "
                                  f"{', '.join(map(str, ranks))})", param="dp_rank")
        return dp_rank - ranks.start

    @property
    def input_modalities(self) -> tuple[str, ...]:
        return media.input_modalities(self.llm.model_config)

    @property
    def max_num_batched_tokens(self) -> int:
        return self.llm.vllm_config.scheduler_config.max_num_batched_tokens

    @property
    def max_num_seqs(self) -> int:
        return self.llm.vllm_config.scheduler_config.max_num_seqs

    def read_load(self, dp_rank: int | None = None) -> dict[str, int]:
        """The routers' load fields of one rank (None: the engine without ranks); an idle one reports nothing
        running whatever its last step said."""
        idle = self.in_flight.idle(dp_rank)
        load = self.load.of(self.dp_ranks.start if dp_rank is None else dp_rank)
        total = self.num_kv_blocks
        return {"active_blocks": 0 if idle else round(load.kv_usage * total),
                "waiting": 0 if idle else load.waiting, "running": 0 if idle else load.running,
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
        core = self.engine_index(request.dp_rank)
        first = True
        with self._in_flight(None if core is None else request.dp_rank):
            async with contextlib.aclosing(self.llm.generate(prompt, params, request.request_id,
                                                             lora_request=lora.lora_request(request.lora),
                                                             data_parallel_rank=core)) as stream:
                while True:
                    try:  # inline, once per output: a context manager here cost 2.6 us a time
                        out = await anext(stream, None)
                    except VLLM_ERRORS as e:
                        raise engine_error(e) from e
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


    @contextlib.contextmanager
    def _in_flight(self, dp_rank: int | None) -> Iterator[None]:
        """``in_flight.running``, telling the load's listeners at both ends: ``read_load`` reports an idle rank as
        running nothing whatever its last step said."""
        try:
            with self.in_flight.running(dp_rank):
                self.load.moved()
                yield
        finally:
            self.load.moved()


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


# What vLLM raises at a request's stream that ``engine_error`` maps.
VLLM_ERRORS = (VLLMClientError, GracefulHTTPError, EngineDeadError, ValueError)


def engine_error(e: Exception) -> EngineError:
    """vLLM's exception as the worker glue's: the client's fault, overload, or an engine failure."""
    if isinstance(e, VLLMClientError):
        return RequestRejected(str(e))
    if isinstance(e, GracefulHTTPError):  # admission control: the queue is full
        return EngineBusy(str(e))
    if isinstance(e, EngineDeadError):
        return EngineError("the vLLM engine died")
    return RequestRejected(str(e))  # vLLM still validates some inputs with plain ValueErrors
