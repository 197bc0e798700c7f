"""SGLang's Engine behind Meshfront's ``Engine`` protocol (imports sglang: runs in an engine environment).

SGLang's layout: its TokenizerManager runs in this process, on our event loop; the scheduler
(model, KV cache) and the detokenizer are child processes. One ``generate`` is one SGLang request
on token ids (``input_ids``), streamed. Its tokenizer stays loaded, because SGLang needs it for
guided decoding and min_new_tokens; the text its detokenizer renders is discarded, the
postprocessor renders ours. Streamed ``output_ids`` are cumulative (SGLang's default); each
output here carries the ids past the last one sent, which is every id ready when asked.

Closing the stream aborts the request: SGLang's generator sends the scheduler an abort when it
is closed or cancelled, and the ``finally`` below asks again (idempotent) so no path leaks one.

With ``--dp-size`` (or ``--attn-dp-size``) SGLang runs one scheduler per data-parallel rank behind its one
TokenizerManager: a request sent to a rank (``EngineRequest.dp_rank``, the router's choice) runs there
(``routed_dp_rank``), and each rank's load comes from its own scheduler's load snapshot.

SGLang's children SIGQUIT this process when one fails (the scheduler on an exception, SGLang's
subprocess watchdog on a crash). SGLang's own handler then kills the whole process tree, this
process included, before the worker could leave discovery; ours resolves ``failed()`` instead,
fails every open stream, and the worker deregisters and exits non-zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import signal
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import Any

from sglang.srt.entrypoints.engine import Engine

from services.workers.engine import EngineError, EngineOutput, EngineRequest, FinishReason, RequestRejected
from services.workers.engine_ranks import RankInFlight
from services.workers.sglang import media, sampling, thinking_budget, transfer
from services.workers.sglang.config import dp_ranks
from services.workers.sglang.kv_events import media_pads

log = logging.getLogger(__name__)

# The resolved ServerArgs fields the worker reads after start (a test pins them to SGLang's fields).
RESOLVED_FIELDS = ("page_size", "dcp_size", "enable_deterministic_inference", "skip_tokenizer_init",
                   "chunked_prefill_size", "max_prefill_tokens", "disaggregation_bootstrap_port",
                   "enable_custom_logit_processor", "model_path")


class SglangEngine:
    """``sglang.Engine`` in this process, its scheduler and detokenizer in child processes."""

    def __init__(self, server_args: Any, *, reasoning_parser: str):
        self.server_args = server_args
        self.reasoning_parser = reasoning_parser  # the worker's --reasoning-parser: the thinking budget's markers
        self._engine: Engine | None = None
        self._limits: sampling.EngineLimits | None = None
        self._death: asyncio.Future[BaseException] | None = None
        self._closing = False
        self._rids = itertools.count()
        self._block_size = 0
        self._total_tokens = 0
        self._batched_tokens = 0
        # Where decode workers reach this worker's bootstrap server (a prefill worker's; set once it serves).
        self.bootstrap_host = ""
        self._bootstrap_port = 0
        self._in_flight = RankInFlight()
        # SGLang's data-parallel ranks, 0..n-1 (1: an engine without ranks; set at start).
        self.dp_size = 1
        # The pad values SGLang gives the images sent, for the KV events' translation (kv_media.py).
        self.media_pads = media_pads()

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._engine is not None:
            return
        loop = asyncio.get_running_loop()
        self._death = loop.create_future()
        # Built in a thread, SGLang leaves SIGQUIT to us during the launch (a scheduler failing
        # to load the model then surfaces as the constructor's error), and the loop keeps answering.
        loop.add_signal_handler(signal.SIGQUIT, self._child_failed)
        engine = await asyncio.to_thread(Engine, server_args=self.server_args)
        self._engine = engine
        # SGLang starts its output loop on the first request and installs SIGTERM (drain, then
        # exit) and SIGQUIT (kill everything) handlers with it. Started now, ours replace them:
        # the worker server's drain on SIGTERM, the death watch on SIGQUIT.
        tm = engine.tokenizer_manager
        tm.auto_create_handle_loop()
        loop.add_signal_handler(signal.SIGQUIT, self._child_failed)
        loop.remove_signal_handler(signal.SIGTERM)
        resolved = engine.server_args.resolved_dict()
        self.dp_size = dp_ranks(engine.server_args)
        # What SGLang itself reports as the KV events' block size (Scheduler.get_init_info).
        self._block_size = resolved["page_size"] * resolved["dcp_size"]
        # The scheduler's KV capacity in tokens, as Engine.get_server_info reports it (which
        # cannot be called here: it drives a loop of its own).
        self._total_tokens = engine._scheduler_init_result.scheduler_infos[0]["max_total_num_tokens"]
        chunk = resolved["chunked_prefill_size"]
        self._batched_tokens = chunk if chunk is not None and chunk > 0 else resolved["max_prefill_tokens"]
        self._bootstrap_port = resolved["disaggregation_bootstrap_port"]
        thinking, thinking_processor = thinking_budget.enforcement(
            self.reasoning_parser, resolved["model_path"], resolved["enable_custom_logit_processor"])
        self._limits = sampling.EngineLimits(
            max_model_len=tm.context_len - tm.num_reserved_tokens,
            defaults=tm.model_config.get_default_sampling_params(),
            seeded=resolved["enable_deterministic_inference"],
            has_tokenizer=not resolved["skip_tokenizer_init"],
            thinking=thinking,
            thinking_processor=thinking_processor,
        )

    async def close(self) -> None:
        if self._engine is not None:
            self._closing = True  # the children exit now: that is no failure
            engine, self._engine = self._engine, None
            await asyncio.to_thread(engine.shutdown)  # kills the children, waiting up to a minute

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise RuntimeError("the SGLang engine is not started")
        return self._engine

    @property
    def limits(self) -> sampling.EngineLimits:
        if self._limits is None:
            raise RuntimeError("the SGLang engine is not started")
        return self._limits

    # What the engine really uses, for the worker's card (valid after start).
    @property
    def max_model_len(self) -> int:
        return self.limits.max_model_len

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def input_modalities(self) -> tuple[str, ...]:
        return media.input_modalities(self.engine.tokenizer_manager.model_config)

    @property
    def num_kv_blocks(self) -> int:
        return self._total_tokens // self._block_size if self._block_size else 0

    @property
    def max_num_batched_tokens(self) -> int:
        return self._batched_tokens

    @property
    def in_flight(self) -> int:
        return self._in_flight.total

    def read_load(self, dp_rank: int | None = None) -> dict[str, int]:
        """The routers' load fields from the schedulers' latest load snapshots (one per DP rank): ``dp_rank``'s
        (None: every snapshot, an engine without ranks); an idle rank reports nothing whatever its last said."""
        total = self.num_kv_blocks
        reader = self.engine.tokenizer_manager.load_snapshot_reader
        # None only with --tokenizer-worker-num > 1, where the router process reads the snapshots.
        snapshots = reader.read_all() if reader is not None and not self._in_flight.idle(dp_rank) else []
        if dp_rank is not None:
            snapshots = [s for s in snapshots if s.dp_rank == dp_rank]
        used = sum(math.ceil(s.num_used_tokens / self._block_size) for s in snapshots)  # pages per pool
        return {"active_blocks": min(total, used),
                "waiting": sum(s.num_waiting_reqs for s in snapshots),
                "running": sum(s.num_running_reqs for s in snapshots), "total_blocks": total}

    def _child_failed(self) -> None:
        death = self._death
        if self._closing or death is None or death.done():
            return
        log.error("an SGLang subprocess failed (SIGQUIT from SGLang; its traceback is above)")
        death.set_result(EngineError("an SGLang subprocess (scheduler or detokenizer) failed"))

    def _dead(self) -> bool:
        return self._death is not None and self._death.done()

    @property
    def child_failed(self) -> bool:
        """One of SGLang's processes reported a failure (its traceback is in the log)."""
        return self._dead()

    async def failed(self) -> BaseException:
        """Returns the engine's fatal error once one of its processes has failed."""
        while self._death is None:
            await asyncio.sleep(0.2)
        return await asyncio.shield(self._death)  # a cancelled watcher must not cancel the death itself

    # -- generation ----------------------------------------------------------------------------------

    def request_kwargs(self, request: EngineRequest, rid: str, bootstrap: transfer.Bootstrap | None = None,
                       decoded: dict[str, list[Any]] | None = None) -> dict[str, Any]:
        """``decoded``: the request's videos and audio as ``media.decode`` gives them, decoded here when not given."""
        kwargs = sampling.request_kwargs(request, rid, self.limits)
        kwargs.update(media.media_kwargs(request, decoded))  # input_ids: each media run collapsed (media.py)
        rank = self.routed_rank(request.dp_rank)
        if rank is not None:
            kwargs["routed_dp_rank"] = rank
        self.media_pads.register(request)
        if bootstrap is not None:
            kwargs.update(bootstrap.request_kwargs())
        return kwargs

    def routed_rank(self, dp_rank: int | None) -> int | None:
        """SGLang's ``routed_dp_rank`` for a request sent to ``dp_rank`` (None: SGLang's own balancing, or one
        rank). A rank the worker lacks is the caller's mistake, named as ``dp_rank``."""
        if dp_rank is None or self.dp_size <= 1:
            return None  # a worker without ranks is rank 0 to the router, which sends no rank to it
        if not 0 <= dp_rank < self.dp_size:
            raise RequestRejected(f"this worker has no data-parallel rank {dp_rank} (its ranks: "
                                  f"{', '.join(map(str, range(self.dp_size)))})", param="dp_rank")
        return dp_rank

    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        # Unique per engine: SGLang keys its request state by rid, and a request id may come back.
        rid = f"{request.request_id}-{next(self._rids)}"
        bootstrap = transfer.bootstrap_for(request.kv_transfer_params, own_host=self.bootstrap_host,
                                           own_port=self._bootstrap_port)
        prefill_leg = transfer.leg(request.kv_transfer_params) is transfer.Leg.PREFILL
        # Videos and audio are decoded off the event loop (the preprocessor has proved they decode).
        decoded = await asyncio.to_thread(media.decode, request.media) if media.needs_decoding(request.media) else None
        kwargs = self.request_kwargs(request, rid, bootstrap, decoded)
        eos, stop_ids, top = request.eos_token_ids, request.stop_token_ids, request.logprobs
        tm = self.engine.tokenizer_manager
        rank = kwargs.get("routed_dp_rank")  # None: SGLang places it (or there is one rank)
        self._in_flight.add(rank)
        sent = 0
        first = True
        finished = False
        try:
            if prefill_leg and bootstrap is not None:
                # Announced before SGLang sees the request: its prefill server produces nothing until the
                # decode leg has connected for this room, so the caller must open that leg now (the paired
                # order, services/postprocessor/disagg_paired.py).
                yield EngineOutput([], kv_transfer_params=bootstrap.returned_params())
            with _sglang_errors():
                stream = await self.engine.async_generate(**kwargs)
            async with contextlib.aclosing(stream):
                while not finished:
                    out = await self._next(stream)
                    if out is None:
                        raise EngineError("SGLang ended the stream without a finish reason")
                    reason = out["meta_info"]["finish_reason"]
                    finished = reason is not None
                    error = sampling.abort_error(reason)
                    if error is not None:
                        raise error
                    new = sampling.new_tokens(out, sent, top)
                    result = EngineOutput(new.token_ids, sampling.finish_reason(reason, eos, stop_ids))
                    if result.finish_reason == FinishReason.ERROR:
                        raise EngineError(f"SGLang finished the request with {reason!r}")
                    if not new.token_ids and not finished:
                        continue  # nothing new (SGLang re-sent its state): the contract wants tokens
                    if finished and prefill_leg and bootstrap is not None:
                        result.kv_transfer_params = bootstrap.returned_params()
                    if top is not None and new.token_ids:
                        result.logprobs = sampling.token_logprobs(new, top)
                    if first:
                        first = False
                        meta = out["meta_info"]
                        result.prompt_tokens = len(request.token_ids)
                        # Absent only on an abort echo for a request that never reached the scheduler.
                        result.cached_tokens = meta.get("cached_tokens", 0)
                    sent += len(new.token_ids)
                    yield result
        finally:
            self._in_flight.remove(rank)
            # A no-op when SGLang's own cleanup already sent it; nobody is left to tell after a death.
            if not finished and self._engine is not None and not self._dead():
                tm.abort_request(rid)

    async def _next(self, stream: AsyncIterator[dict[str, Any]]) -> dict[str, Any] | None:
        """The next SGLang output, or EngineError as soon as the engine dies (its outputs stop)."""
        death = self._death
        if death is None:
            raise RuntimeError("the SGLang engine is not started")
        step = asyncio.ensure_future(anext(stream, None))
        try:
            await asyncio.wait((step, death), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not step.done():
                # Our consumer went away, or the engine died: the cancellation reaches SGLang's
                # generator, which aborts the request. Wait for it, so that the generator is no
                # longer running when it is closed.
                step.cancel()
                await asyncio.wait((step,))
        if step.cancelled():
            raise EngineError(f"the SGLang engine died: {death.result()}")
        with _sglang_errors():
            return step.result()


@contextlib.contextmanager
def _sglang_errors() -> Iterator[None]:
    """SGLang's validation errors (plain ValueErrors: a prompt too long, bad sampling values) are the client's."""
    try:
        yield
    except ValueError as e:
        raise RequestRejected(str(e)) from e
