"""The mocker engine: the scheduler and KV cache driven by one asyncio task on simulated time.

One loop task runs engine steps while there is work. After each step it waits out the step's
simulated duration (``TimingModel``, on an injected ``Clock``) and then hands the step's tokens to
each sequence's ``TokenStream``, so tokens appear at the pace a real engine would produce them.
At speed-up 0 there is no wait; the loop still yields to the event loop every couple of
milliseconds so that consumers run, and whatever piled up meanwhile leaves in one message.

A consumer that stops iterating aborts its sequence on the spot (blocks freed synchronously).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncGenerator, Sequence

import xxhash

from services.common.hashing import media_block_infos
from services.common.kv_events import KvEventListener, StoredBlock
from services.workers.engine import (
    EngineBusy,
    EngineError,
    EngineOutput,
    EngineRequest,
    FinishReason,
    KvTransferFailed,
    MediaInput,
    RequestRejected,
    TokenStream,
)
from services.workers.mocker.config import MockerEngineConfig
from services.workers.mocker.guided import structural_text
from services.workers.mocker.kv_cache import KvCache
from services.workers.mocker.outputs import OutputPolicy, synthetic_logprob
from services.workers.mocker.scheduler import Scheduler, SchedulerLimits, StepOutcome
from services.workers.mocker.sequence import Sequence as Seq
from services.workers.mocker.sequence import full_blocks
from services.workers.mocker.timing import Clock, MonotonicClock
from services.workers.mocker.transfer import (
    REMOTE_HANDLE,
    ComputedKv,
    KvHolds,
    KvPuller,
    RemotePrefill,
    TransferSettings,
    matched_blocks,
    remote_prefill,
    transfer_metrics,
    wants_remote_decode,
)

log = logging.getLogger(__name__)

# At speed-up 0, how long the loop may run steps before letting consumers in.
_INSTANT_SLICE_S = 0.002
# Placeholder ids of media tokens (ordinary vocabulary ids; only the KV cache and usage see them).
_MEDIA_TOKEN_BASE = 1000
_MEDIA_TOKEN_SPAN = 29000
# A step that made no progress although work is queued (cannot happen while requests are
# validated against capacity) backs off instead of spinning.
_STALL_BACKOFF_S = 0.001


class MockerEngine:
    """Implements ``services.workers.engine.Engine`` with simulated compute."""

    def __init__(self, config: MockerEngineConfig, outputs: OutputPolicy, *, eos_token_ids: Sequence[int] = (),
                 clock: Clock | None = None, listener: KvEventListener | None = None,
                 puller: KvPuller | None = None):
        self.config = config
        self.outputs = outputs
        self.eos_token_ids = tuple(eos_token_ids)
        self.cache = KvCache(config.num_gpu_blocks, config.block_size, listener)
        self.scheduler = Scheduler(self.cache, SchedulerLimits(
            max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
            enable_chunked_prefill=config.enable_chunked_prefill))
        self.timing = config.timing()
        # Disaggregation: blocks held for decode workers (a prefill leg's), and how a decode leg takes them.
        self.transfer = TransferSettings(config.kv_block_bytes, config.kv_transfer_bandwidth_gbs,
                                         config.kv_hold_timeout_s, config.speedup_ratio, config.kv_transfer_overlap)
        self._clock = clock or MonotonicClock()
        self.holds = KvHolds(self.cache, self.transfer, now=self._clock.now)
        self._puller = puller
        self.steps = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="mocker-engine")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._fail_all(EngineError("the worker is shutting down"))
        self.holds.release_all()

    def backlog(self) -> int:
        """Sequences running and waiting: where a worker of data-parallel ranks runs a request given no rank."""
        return len(self.scheduler.waiting) + len(self.scheduler.running)

    def read_load(self) -> dict[str, int]:
        """The routers' load fields, as every engine reports them (published with the KV events)."""
        return {"active_blocks": self.cache.active_blocks, "waiting": len(self.scheduler.waiting),
                "running": len(self.scheduler.running), "total_blocks": self.config.num_gpu_blocks}

    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        waiting = len(self.scheduler.waiting)
        if self.config.max_waiting and waiting >= self.config.max_waiting:
            raise EngineBusy(f"the worker's queue is full ({waiting} waiting)")
        seq = self._new_sequence(request)
        source = remote_prefill(request.kv_transfer_params)
        if source is not None:
            seq.first_token_with_kv = source.pipelined
        pulled = await self._pull(source, seq) if source is not None else None
        await self.start()
        if pulled is not None:
            self._store_pulled(seq, *pulled)  # no await from here to add: a cancel cannot strand the pin
        self.scheduler.add(seq)
        self._wake.set()
        announced = None
        if seq.hold_on_finish and self.transfer.overlap:
            # The paired order: the caller opens the decode leg now, whose pull waits here for the prefill.
            announced = self.holds.reserve(seq.request_id, len(seq.prompt))
            seq.reserved_handle = announced[REMOTE_HANDLE]
        stream = seq.stream
        assert stream is not None
        handed_over = False  # the output naming the held blocks reached the consumer
        try:
            if announced is not None:
                yield EngineOutput([], kv_transfer_params=announced)
            async for output in stream:
                if seq.reserved_handle and output.finish_reason is not FinishReason.NONE:
                    # The paired order: the token goes out now, but the leg lasts until its decode leg took the
                    # KV (as SGLang's prefill server's does), so that a caller who ends it (the answer needed no
                    # decode leg, the client left) frees the blocks by cancelling the call.
                    yield dataclasses.replace(output, finish_reason=FinishReason.NONE, kv_transfer_params=None)
                    await self.holds.until_ended(seq.transfer_handle)
                    output = EngineOutput([], output.finish_reason, kv_transfer_params=output.kv_transfer_params)
                handed_over = output.kv_transfer_params is not None
                yield output
        finally:
            stream.close()
            self._end_request(seq, handed_over)

    def _end_request(self, seq: Seq, handed_over: bool) -> None:
        """Frees what the consumer's leaving leaves behind; ``handed_over``: the output naming a hold reached it."""
        if not seq.finished:
            self.scheduler.abort(seq)
        elif seq.transfer_handle:
            if not handed_over:
                self.holds.release(seq.transfer_handle)  # nobody learnt the handle: nobody will pull it
        elif seq.hold_on_finish:
            # It finished in the step still being simulated; its blocks would be held when that ends.
            self.scheduler.release_finished(seq)
        if seq.reserved_handle:
            # Still announced, or held and not pulled: nobody will pull it (a waiting pull learns so).
            self.holds.release(seq.reserved_handle)

    async def _pull(self, source: RemotePrefill, seq: Seq) -> tuple[list[StoredBlock], int]:
        """Takes the prefill worker's blocks (freeing them there) and waits out their transfer time; returns
        the ones that cover this prompt and the prompt tokens whose KV came with them. Raises
        ``KvTransferFailed`` for parameters it cannot resolve."""
        if self._puller is None:
            raise KvTransferFailed("this worker cannot pull KV blocks from another")
        transfers, _ = transfer_metrics()
        try:
            pulled = await self._puller.pull(source)
            blocks = matched_blocks(pulled, seq.prompt_blocks)
        except KvTransferFailed:
            transfers.labels("refused").inc()
            raise
        # Only what the link could not move while the prefill computed (all of it without overlap).
        await self._clock.sleep(self.transfer.exposed_seconds(len(pulled.block_hashes), pulled))
        transfers.labels("received").inc()
        # Every block matched: the whole held prompt came, its unfilled tail block too.
        complete = len(blocks) == len(pulled.block_hashes)
        return blocks, pulled.num_tokens if complete else len(blocks) * self.config.block_size

    def _store_pulled(self, seq: Seq, blocks: list[StoredBlock], tokens: int) -> None:
        """The pulled blocks enter this cache (KV events announce them), referenced for ``seq`` until it is
        admitted. A cache too full for them leaves the prompt to be computed here, as a real engine would."""
        if not self.cache.allocate(blocks, None):
            log.warning("request %s: no room for %d transferred blocks; computing its prompt here",
                        seq.request_id, len(blocks))
            return
        seq.pinned = [b.block_hash for b in blocks]
        seq.transferred_tokens = tokens

    # -- request intake ---------------------------------------------------------------------------

    def _new_sequence(self, request: EngineRequest) -> Seq:
        text_prompt = list(request.token_ids)
        cfg = self.config
        if not text_prompt:
            raise RequestRejected("the prompt is empty")
        prompt, spans = self._place_media(text_prompt, request.media)
        room = cfg.context_length - len(prompt)
        if room <= 0:
            raise RequestRejected(f"the prompt has {len(prompt)} tokens; the context window is {cfg.context_length}")
        if request.max_tokens is not None and request.max_tokens <= 0:
            raise RequestRejected("max_tokens must be at least 1")
        max_tokens = room if request.max_tokens is None else min(request.max_tokens, room)
        hold = wants_remote_decode(request.kv_transfer_params)
        if hold:
            max_tokens = 1  # a prefill leg: one token, then the decode worker takes over
        capacity = cfg.num_gpu_blocks * cfg.block_size
        if len(prompt) + max_tokens > capacity:
            raise RequestRejected(f"prompt plus max_tokens ({len(prompt) + max_tokens}) exceeds the KV cache "
                                  f"({capacity} tokens)")
        eos_ids = request.eos_token_ids or self.eos_token_ids
        eos_id = eos_ids[0] if eos_ids and not request.ignore_eos else None
        plan = self.outputs.plan(text_prompt, seed=request.sampling.seed, max_tokens=max_tokens,
                                 min_tokens=request.min_tokens, eos_id=eos_id, ignore_eos=request.ignore_eos,
                                 guided_json_schema=_json_schema_only(request),
                                 guided_answer=_structural_answer(request),
                                 max_thinking_tokens=request.max_thinking_tokens)
        mm_infos = media_block_infos(spans, cfg.block_size) or None
        lora_name = request.lora.adapter.name if request.lora is not None else None
        seq = Seq(request.request_id, prompt, plan, full_blocks(prompt, cfg.block_size, mm_infos, lora_name),
                  stream=TokenStream(logprobs=request.logprobs is not None), mm_infos=mm_infos, lora_name=lora_name)
        seq.top_logprobs = request.logprobs
        seq.hold_on_finish = hold
        return seq

    def _place_media(self, prompt: list[int], media: Sequence[MediaInput]
                     ) -> tuple[list[int], list[tuple[int, int, int]]]:
        """The prompt with every item in it, and each item's ``(offset, length, content_hash)``.

        An item the preprocessor placed (token_count > 0) already has its placeholder run in the prompt, sized
        from the image (media/placement.py). One it did not place becomes a fixed number of placeholder tokens
        at the end (--image-tokens, --audio-tokens), as an engine that places media itself would add them; their
        ids derive from the content. Either way the blocks holding an item are salted with its content hash."""
        spans: list[tuple[int, int, int]] = []
        out = prompt
        for item in media:
            if item.modality not in self.config.input_modalities:
                raise RequestRejected(f"this worker does not accept {item.modality} input")
            identity = item.content_hash or xxhash.xxh3_64_intdigest(
                f"{item.modality}:{item.url}:{item.format}:{item.data}".encode())
            if item.token_count:
                if item.token_offset + item.token_count > len(prompt):
                    raise RequestRejected(f"a {item.modality}'s placeholder tokens lie past the prompt's end")
                spans.append((item.token_offset, item.token_count, identity))
                continue
            n = {"image": self.config.image_tokens, "video": self.config.image_tokens}.get(item.modality,
                                                                                       self.config.audio_tokens)
            if out is prompt:
                out = list(prompt)
            spans.append((len(out), n, identity))
            out += [_MEDIA_TOKEN_BASE + (identity + i) % _MEDIA_TOKEN_SPAN for i in range(n)]
        return out, spans

    # -- the loop ---------------------------------------------------------------------------------

    async def _run(self) -> None:
        next_at = self._clock.now()
        slice_start = time.perf_counter()
        while True:
            if not self.scheduler.has_work():
                self._wake.clear()
                await self._wake.wait()
                next_at = self._clock.now()
                slice_start = time.perf_counter()
                continue
            try:
                outcome = self.scheduler.step()
            except Exception:  # a simulator bug must not hang every client: fail them and reset
                log.exception("mocker step failed; failing all sequences")
                self._fail_all(EngineError("the mocker engine failed"))
                self.cache.clear()
                self.holds.discard_all()
                continue
            self.steps += 1
            delay = self.timing.step_seconds(outcome)
            if delay > 0:
                now = self._clock.now()
                # The timing model is an engine's whole step, its scheduling included: the mocker's own work
                # since the last step ended (delivering it, scheduling this one) runs inside the modelled time,
                # and lengthens the step only where it overruns it.
                started = max(next_at, now - delay)
                next_at = started + delay
                self._time_held_prefill(outcome, started, delay)
                await self._clock.sleep(next_at - now)
                self._deliver(outcome)
            else:
                next_at = self._clock.now()
                self._time_held_prefill(outcome, next_at, 0.0)
                self._deliver(outcome)
                if outcome.idle and not outcome.emitted:
                    await asyncio.sleep(_STALL_BACKOFF_S)
                elif time.perf_counter() - slice_start > _INSTANT_SLICE_S:
                    await asyncio.sleep(0)
                    slice_start = time.perf_counter()

    @staticmethod
    def _time_held_prefill(outcome: StepOutcome, started: float, duration: float) -> None:
        """When each held prefill leg's KV was computed (a cached prefix: when the step began), for the decode
        worker's pipelined transfer. One entry per step and sequence, not per token."""
        for seq, tokens, cached in outcome.held_prefill:
            seq.kv_computed.append(ComputedKv(started, 0.0 if cached else duration, tokens))

    def _deliver(self, outcome: StepOutcome) -> None:
        vocab = self.outputs.vocab
        for e in outcome.emitted:
            seq = e.seq
            stream = seq.stream
            if e.finish and seq.hold_on_finish:
                self._hold(seq, stream)
            if stream is None or stream.closed:
                continue
            if e.index == 0:
                stream.set_prompt_info(len(seq.prompt), seq.cached_tokens or 0)
            logprob = None
            if seq.top_logprobs is not None:
                logprob = synthetic_logprob(e.token_id, e.index, seq.top_logprobs, vocab)
            stream.push(e.token_id, logprob, e.finish)

    def _hold(self, seq: Seq, stream: TokenStream | None) -> None:
        """A finished prefill leg: its blocks stay for the decode worker, named in its last output."""
        blocks, partial = seq.held, seq.holds_partial
        seq.held, seq.holds_partial = [], False
        params = self.holds.hold(seq.request_id, blocks, partial, len(seq.prompt), seq.kv_computed,
                                 seq.reserved_handle)
        seq.transfer_handle = params["remote_handle"]
        if stream is None or stream.closed:  # the caller left during the step: nobody will pull them
            self.holds.release(seq.transfer_handle)
        else:
            stream.set_transfer_params(params)

    def _fail_all(self, error: EngineError) -> None:
        for seq in self.scheduler.abort_all():
            if seq.stream is not None:
                seq.stream.fail(error)


def _structural_answer(request: EngineRequest) -> str | None:
    """A structural tag's forced calls, written out (guided.structural_text); None: the script answers."""
    if request.guided is None or not request.guided.structural_tag:
        return None
    return structural_text(request.guided.structural_tag)


def _json_schema_only(request: EngineRequest) -> str | None:
    """The mocker writes JSON for a schema; other constraints it cannot honour are refused."""
    if request.guided is None or request.guided.structural_tag:
        return None
    schema = request.guided.as_json_schema()
    if schema is None:
        raise RequestRejected(f"the mocker supports JSON guided decoding only, not {request.guided.kind()}")
    return schema
