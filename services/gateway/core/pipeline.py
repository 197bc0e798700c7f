"""One OpenAI request through the mesh: preprocess, route, generate, release.

Yields lists of ``Delta``: everything that was ready when the consumer asked,
so that the server can pack it into one HttpBody. Errors raised before the
first yield become HTTP statuses; later ones travel in-band.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Sequence

from meshfront.common.v1 import common_pb2
from meshfront.postprocessor.v1 import postprocessor_pb2
from meshfront.preprocessor.v1 import preprocessor_pb2
from meshfront.router.v1 import router_pb2

from services.common import tracing
from services.common.decision_record import CandidateScore, DecisionRecord
from services.common.dp_ranks import target_id
from services.common.errors import InvalidRequest, WorkerFailed
from services.gateway import scheduling
from services.gateway.clients import PostprocessorClient, PreprocessorClient, RouterClient
from services.gateway.core.delta import FINISH, Delta
from services.gateway.core.pins import named_as_sent
from services.gateway.core.route_lease import RouteLease, RouteLeases
from services.gateway.core.trace import RequestTrace, RouteHints, TracedPrompt
from services.gateway.worker_metrics import ChoiceLoad, worker_view

_DONE = object()
_NO_HINTS = RouteHints()


@dataclasses.dataclass(frozen=True)
class _RoutedChoice:
    """One choice of a request, routed and ready to generate."""

    index: int
    counts_prompt: bool  # the first choice of its prompt: its prompt tokens count once in usage
    prompt_len: int
    lease: RouteLease
    gen: postprocessor_pb2.GenerateRequest
    load: ChoiceLoad  # its load on its workers, as Dynamo's per-worker families show it (worker_metrics.py)
    record: DecisionRecord | None = None  # asked for (nvext.extra_fields "routing"): actual cached tokens go here


class Pipeline:
    def __init__(self, pre: PreprocessorClient, router: RouterClient, post: PostprocessorClient,
                 stream_interval: int = 1):
        self.pre = pre
        self.router = router
        self.post = post
        self.stream_interval = stream_interval  # unless the request set its own (nvext.stream_interval)
        self.leases = RouteLeases(router)
        self.workers = worker_view()

    async def _start(self, prepared: preprocessor_pb2.PreprocessResponse, options: common_pb2.PostprocessOptions,
                     request_id: str, index: int, choice: int, worker_id: str, hints: RouteHints,
                     trace: RequestTrace | None) -> _RoutedChoice:
        # One copy of the request, filled in place (upb's constructor copies a message argument twice: 0.2 ms
        # for a 6k-token prompt); each choice then edits only its own copy. The preprocessor's options say what
        # it learnt from the model, ``options`` what the request asked.
        gen = postprocessor_pb2.GenerateRequest()
        gen.request.CopyFrom(prepared.request)
        gen.options.CopyFrom(prepared.postprocess)
        gen.options.MergeFrom(options)
        if not gen.options.stream_interval:
            gen.options.stream_interval = self.stream_interval
        req = gen.request
        req.request_id = request_id
        if tracing.ENABLED:  # the postprocessor's and worker's spans join the served call's trace
            req.traceparent = tracing.current_traceparent()
        if choice and req.sampling.HasField("seed"):
            req.sampling.seed = (req.sampling.seed + choice) % 2**64  # distinct but reproducible choices
        try:
            with self.workers.routing():
                lease = await self.leases.route(scheduling.stamp(router_pb2.RouteRequest(
                    request_id=request_id, model=req.model, block_hashes=prepared.block_hashes,
                    prompt_tokens=len(req.token_ids), worker_id=worker_id, session_id=hints.session_id,
                    session_action=hints.session_action, session_timeout_s=hints.session_timeout_s,
                    priority_jump_s=hints.priority_jump_s, prefill_worker_id=hints.prefill_worker_id,
                    decode_worker_id=hints.decode_worker_id, explain=hints.explain,
                    affinity_session_id=hints.affinity_session_id, dp_rank=hints.dp_rank,
                    prefill_dp_rank=hints.prefill_dp_rank)))  # its class and tenant (scheduling.py)
        except InvalidRequest as e:  # a bad pin: named as the client sent it (the router knows only the field)
            raise named_as_sent(e, hints.pin_names) from None
        route = lease.route
        gen.worker_address, gen.worker_id = route.address, route.worker_id
        # Disaggregated: the prefill leg's worker (empty for an aggregated request).
        gen.prefill_worker_address, gen.prefill_worker_id = route.prefill_address, route.prefill_worker_id
        # The workers' data-parallel ranks the router chose (services/common/dp_ranks.py): the worker runs it there.
        if route.HasField("dp_rank"):
            req.dp_rank = route.dp_rank
        if route.HasField("prefill_dp_rank"):
            gen.prefill_dp_rank = route.prefill_dp_rank
        record = decision_record(route.decision) if route.HasField("decision") else None
        if record is not None and route.HasField("dp_rank"):
            record.dp_rank = route.dp_rank
        if trace is not None:
            trace.on_routed(index, route.worker_id, route.queue_depth, route.prefill_worker_id)
            if record is not None:
                trace.routing[index] = record
        # Per data-parallel rank, as Dynamo's families label them (dp_rank): the ranks' target ids.
        decode_rank = route.dp_rank if route.HasField("dp_rank") else None
        prefill_rank = route.prefill_dp_rank if route.HasField("prefill_dp_rank") else None
        load = self.workers.choice(req.model, target_id(route.worker_id, decode_rank),
                                   target_id(route.prefill_worker_id, prefill_rank) if route.prefill_worker_id else "",
                                   len(req.token_ids))
        return _RoutedChoice(index, choice == 0, len(req.token_ids), lease, gen, load, record)

    async def run(self, requests: Sequence[preprocessor_pb2.PreprocessRequest], n: int,
                  worker_id: str = "", hints: RouteHints = _NO_HINTS,
                  trace: RequestTrace | None = None, *,
                  options: common_pb2.PostprocessOptions) -> AsyncIterator[list[Delta]]:
        """``options``: the request's own postprocess options (``postprocess_options``: tools, tool choice,
        single tool call, stream interval), the same for each of its prompts. ``trace`` (optional)
        records what the request went through, for nvext responses."""
        prepared = await asyncio.gather(*(self.pre.preprocess(r) for r in requests))
        if trace is not None:
            trace.prompts = [TracedPrompt(list(p.request.token_ids), p.formatted_prompt) for p in prepared]
        base_id = requests[0].request.request_id
        total = len(requests) * n
        choices: list[_RoutedChoice] = []
        try:
            for p, prep in enumerate(prepared):
                for j in range(n):
                    index = p * n + j
                    rid = base_id if total == 1 else f"{base_id}-{index}"
                    choices.append(await self._start(prep, options, rid, index, j, worker_id, hints, trace))
            if total == 1:
                async for deltas in self._stream(choices[0]):
                    if trace is not None:
                        _record(trace, deltas)
                    yield deltas
            else:
                live = total
                async for batch in self._merge(choices):
                    if trace is not None:
                        for d in batch:
                            live -= d.finish_reason is not None
                            trace.on_output(d.prompt_tokens if d.counts_prompt else 0, d.cached_tokens, not live,
                                            d.index, d.worker_id, d.prefill_worker_id, d.kv_transfer_ms)
                    yield batch
        finally:
            for c in choices:
                c.load.ended(0)  # a choice whose stream never ran (its own end came first otherwise)
                c.lease.release()

    async def _stream(self, c: _RoutedChoice) -> AsyncIterator[list[Delta]]:
        """One choice's deltas, as many as were ready together; tells the router about the first token
        (when it asked to know: ``RouteLease.report_first_token``)."""
        generated = 0
        try:
            async for responses in self.post.generate(c.gen):
                deltas = []
                for resp in responses:
                    delta = self._delta(c.index, c.counts_prompt, c.prompt_len, resp)
                    if delta.worker_id:  # a migration or a decode leg's start, told before the output it carries
                        c.load.moved(delta.worker_id, delta.prefill_worker_id)
                    if delta.prompt_tokens:  # the first output (of the request, or of its migrated continuation)
                        c.lease.report_first_token(resp.cached_tokens, resp.prompt_tokens)
                        c.load.first_output(resp.prompt_tokens)
                        if c.record is not None and c.record.actual_cached_tokens is None:
                            c.record.actual_cached_tokens = resp.cached_tokens  # the routed worker's, not a later one's
                    generated += delta.completion_tokens
                    deltas.append(delta)
                yield deltas
        finally:
            c.load.ended(generated)

    @staticmethod
    def _delta(index: int, counts_prompt: bool, prompt_len: int, resp: postprocessor_pb2.GenerateResponse) -> Delta:
        if resp.finish_reason == common_pb2.FINISH_REASON_ERROR:
            raise WorkerFailed("The worker failed while generating this response")
        # Once per token, and each proto field read costs: every field read once, positional arguments, and
        # the repeated fields copied only when there is something in them (tool calls, logprobs when asked
        # for); an empty one becomes the shared ().
        prompt_tokens = resp.prompt_tokens
        first = prompt_tokens > 0
        tool_calls, logprobs = resp.tool_calls, resp.logprobs
        delta = Delta(index, resp.text, resp.reasoning_text, list(tool_calls) if tool_calls else (),
                      list(logprobs) if logprobs else (), FINISH.get(resp.finish_reason), resp.stop_reason,
                      resp.completion_tokens, (prompt_tokens or prompt_len) if first else 0,
                      resp.cached_tokens if first else 0, counts_prompt and first, resp.worker_id)
        if delta.worker_id:  # rare (a migration, a decode leg's start): only then are these read
            delta.prefill_worker_id, delta.kv_transfer_ms = resp.prefill_worker_id, resp.kv_transfer_ms
        return delta

    async def _merge(self, choices: list[_RoutedChoice]) -> AsyncIterator[list[Delta]]:
        """Runs every choice's stream at once and yields whatever is ready, across choices."""
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(choice: _RoutedChoice) -> None:
            try:
                async for deltas in self._stream(choice):
                    queue.put_nowait(deltas)
                queue.put_nowait(_DONE)
            except Exception as e:  # noqa: BLE001 - handed to the consumer, which re-raises it
                queue.put_nowait(e)

        tasks = [asyncio.create_task(pump(c)) for c in choices]
        live = len(tasks)
        try:
            while live:
                items = [await queue.get()]
                while not queue.empty():
                    items.append(queue.get_nowait())
                batch = []
                for item in items:
                    if item is _DONE:
                        live -= 1
                    elif isinstance(item, Exception):
                        raise item
                    else:
                        batch.extend(item)
                if batch:
                    yield batch
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t


def _record(trace: RequestTrace, deltas: list[Delta]) -> None:
    """One choice's outputs into its trace: only those that change it (the first output, the prompt's counts,
    a move to another worker, the finish); a plain token in between would only cost a call per token."""
    for d in deltas:
        if d.prompt_tokens or d.finish_reason is not None or d.worker_id or trace.first_token is None:
            trace.on_output(d.prompt_tokens if d.counts_prompt else 0, d.cached_tokens, d.finish_reason is not None,
                            d.index, d.worker_id, d.prefill_worker_id, d.kv_transfer_ms)


def decision_record(d: router_pb2.RoutingDecision) -> DecisionRecord:
    """The router's RoutingDecision as the plain record (its actual cached tokens still unknown)."""
    return DecisionRecord(d.policy, d.chosen_by, d.worker_id, tuple(
        CandidateScore(c.worker_id, c.overlap_blocks, c.in_flight, c.booked_prompt_tokens,
                       c.active_blocks if c.HasField("active_blocks") else None,
                       c.score if c.HasField("score") else None, c.eligible,
                       c.dp_rank if c.HasField("dp_rank") else None) for c in d.candidates),
        d.predicted_cached_tokens, d.prompt_tokens, d.prefill_worker_id)
