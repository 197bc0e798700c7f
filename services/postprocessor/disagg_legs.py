"""One attempt of a disaggregated request: the prefill leg on the prefill worker, then the decode leg on the
decode worker (docs/architecture.md, "Disaggregated prefill and decode").

- **Prefill leg**: the request with ``max_tokens`` 1 and ``disaggregation.role`` PREFILL. Its worker computes
  the prompt, emits the first token and holds the prompt's KV blocks, naming them in the last chunk's
  ``kv_transfer_params``. That token goes to the client at once, built by the request's one decoder like any
  other: time to first token never waits for the transfer. The leg's finish LENGTH is the leg's own budget,
  not the request's, and is dropped (unless the request wanted one token: then it is the request's).
- **Decode leg**: started on the decode worker before the first token is handed on, as a continuation (prompt
  plus the first token, budgets reduced) with role DECODE and the transfer parameters untouched; its worker
  pulls the blocks and decodes, and its tokens feed the same decoder. Its first response names both workers
  and the time from the prefill leg's end (``worker_id``, ``prefill_worker_id``, ``kv_transfer_ms``).

Failures name the worker to blame (``blamed``), which the postprocessor's migration excludes when it routes
again: a failed prefill leg blames the prefill worker; a decode leg whose transfer parameters could not be
resolved (the decode worker says so with ``param`` ``kv_transfer_params``) blames the prefill worker too; any
other decode failure blames the decode worker. The next attempt runs the prefill again on the continuation,
so the tokens stay exactly those of an undisturbed run at temperature 0.

Whenever an attempt ends before the decode worker sent anything (the client hung up during the prefill or
the transfer, a leg failed, the first token finished the request), the blocks the prefill worker may still
hold are released explicitly (``KvReleaser``): nobody will pull them.

That is vLLM's and the mocker's order. A prefill worker whose engine pairs by bootstrap (SGLang) announces it
in its leg's first chunk (transfer parameters before any token); the attempt is then a ``PairedLegs`` instead,
both legs at once (disagg_paired.py). The postprocessor opens the prefill leg and reads that first chunk before
it picks the attempt's kind (service.py, ``_open_attempt``), so ``SequentialLegs`` starts from it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from typing import Protocol

from meshfront.common.v1 import common_pb2
from meshfront.postprocessor.v1 import postprocessor_pb2
from meshfront.worker.v1 import worker_pb2

from services.common import tracing
from services.common.errors import MeshError, WorkerFailed
from services.common.pump import Batch
from services.postprocessor.aggregated import CallReader
from services.postprocessor.attempt import WorkerCall, WorkerClient
from services.postprocessor.disagg_common import drop_leg_budget, name_both_workers, refused_transfer
from services.postprocessor.migration import WorkerRoute, continuation, with_rank

PREFILL_ENDED = "the prefill worker ended the stream without a finish reason"


class KvReleaser(Protocol):
    """Frees blocks the route's prefill worker holds for a transfer, through whichever worker of the pair serves
    the release (kv_release.GrpcKvReleaser); never raises."""

    def release(self, route: WorkerRoute, model: str, kv_transfer_params: bytes) -> None: ...


def prefill_leg(request: common_pb2.PreprocessedRequest, route: WorkerRoute) -> worker_pb2.GenerateRequest:
    """The prefill leg's worker call. Built inside the call's message: ``GenerateRequest(request=leg)`` would
    copy the whole prompt once more (upb copies a message given to a constructor; 0.15-0.2 ms at 6k tokens)."""
    call = worker_pb2.GenerateRequest()
    leg = call.request
    leg.CopyFrom(request)
    leg.stop.max_tokens = 1
    if leg.stop.HasField("min_tokens"):
        leg.stop.min_tokens = min(leg.stop.min_tokens, 1)
    leg.disaggregation.role = common_pb2.DISAGGREGATION_ROLE_PREFILL
    leg.disaggregation.peer_worker_id, leg.disaggregation.peer_address = route.worker_id, route.address
    with_rank(leg, route.prefill_dp_rank)  # the prefill worker's rank (the request carries the decode worker's)
    return call


def decode_leg(request: common_pb2.PreprocessedRequest, first: list[int], route: WorkerRoute,
               kv_transfer_params: bytes) -> worker_pb2.GenerateRequest:
    """The decode leg's worker call, built in place as the prefill leg's is."""
    call = worker_pb2.GenerateRequest()
    leg = continuation(request, first, into=call.request)
    leg.disaggregation.role = common_pb2.DISAGGREGATION_ROLE_DECODE
    leg.disaggregation.kv_transfer_params = kv_transfer_params
    leg.disaggregation.peer_worker_id, leg.disaggregation.peer_address = route.prefill_worker_id, route.prefill_address
    return call


class SequentialLegs:
    """One attempt in the sequential order, from its prefill leg's call and first batch (read already, by whoever
    chose the order); ``blamed`` says whose failure ended it."""

    def __init__(self, route: WorkerRoute, request: common_pb2.PreprocessedRequest, prefill_call: WorkerCall,
                 first: Batch[worker_pb2.GenerateResponse], workers: WorkerClient, reader: CallReader,
                 releaser: KvReleaser):
        self.blamed = route.prefill_worker_id
        self._route, self._request = route, request
        self._prefill_call, self._first = prefill_call, first
        self._workers, self._reader, self._releaser = workers, reader, releaser
        self._before = len(reader.builder.decoder.generated_ids)  # the ids this attempt's prefill leg adds follow

    async def responses(self) -> AsyncGenerator[postprocessor_pb2.GenerateResponse, None]:
        try:
            messages = await _prefill(self._prefill_call, self._first)
        finally:
            # A cancel here (the client left mid-prefill) aborts the sequence on the worker, blocks and all.
            self._prefill_call.cancel()  # a no-op once the leg ended
        params = messages[-1].kv_transfer_params
        ended_at = time.monotonic()
        ended_ns = time.time_ns() if tracing.ENABLED else 0  # the trace's transfer span starts here
        drop_leg_budget(messages, self._request)
        route, builder = self._route, self._reader.builder
        decode_call = None
        decoding = False  # the decode worker sent its first chunk: it pulled the blocks
        try:
            response = builder.build(messages)
            if builder.decoder.finish is None:
                # Opened before the first token is handed on: the transfer overlaps the client's first chunk.
                decode_call = self._open_decode(params)
            if response is not None:
                yield response
            if decode_call is None:
                return
            self.blamed = route.worker_id
            async for response in self._reader.responses(route.address, decode_call):
                if not decoding:
                    decoding = True
                    self._mark_first_decoded(response, ended_at, ended_ns)
                yield response
        except MeshError as e:
            if not decoding and refused_transfer(e):
                self.blamed = route.prefill_worker_id  # its blocks are gone, not the decode worker
                raise WorkerFailed("the KV transfer from the prefill worker failed") from e
            raise
        finally:
            self._end_decode(decode_call, params, decoding)

    def _open_decode(self, params: bytes) -> WorkerCall:
        """The decode leg's call: the request continued after the prefill leg's token, with its transfer ``params``."""
        if not params:
            raise WorkerFailed("the prefill worker returned no KV transfer parameters")
        first = self._reader.builder.decoder.generated_ids[self._before:]
        return self._workers.generate(self._route.address, decode_leg(self._request, first, self._route, params))

    def _mark_first_decoded(self, response: postprocessor_pb2.GenerateResponse, ended_at: float,
                            ended_ns: int) -> None:
        """The decode leg's first response names both workers and the time since the prefill leg's end."""
        name_both_workers(response, self._route, ended_at)
        if ended_ns:
            _transfer_span(self._request.traceparent, ended_ns, self._route)

    def _end_decode(self, decode_call: WorkerCall | None, params: bytes, decoding: bool) -> None:
        """Cancels the decode leg (a no-op once it ended); blocks no decode worker pulled are released."""
        if decode_call is not None:
            decode_call.cancel()
        if params and not decoding:
            self._releaser.release(self._route, self._request.model, params)


async def _prefill(call: WorkerCall, batch: Batch[worker_pb2.GenerateResponse]) -> list[worker_pb2.GenerateResponse]:
    """The prefill leg's messages up to and including its finishing one, from its first ``batch`` (read already)."""
    if not batch.messages:  # then the leg ended or failed before its first message (disagg_common.first_batch)
        _check(batch, ended=PREFILL_ENDED)
    messages = batch.messages
    while messages[-1].finish_reason == common_pb2.FINISH_REASON_UNSPECIFIED:
        batch = await call.next_batch()
        messages.extend(batch.messages)
        if messages[-1].finish_reason == common_pb2.FINISH_REASON_UNSPECIFIED:
            _check(batch, ended=PREFILL_ENDED)
    return messages


def _transfer_span(traceparent: str, started_ns: int, route: WorkerRoute) -> None:
    """The KV transfer in the request's trace: from the prefill leg's end to the decode worker's first chunk
    (the decode worker pulled the blocks by then)."""
    tracing.end_span(tracing.start_span("kv_transfer", traceparent, {
        "meshfront.prefill_worker_id": route.prefill_worker_id, "meshfront.decode_worker_id": route.worker_id},
        start_ns=started_ns))


def _check(batch: Batch[worker_pb2.GenerateResponse], *, ended: str) -> None:
    if batch.error is not None:
        raise batch.error if isinstance(batch.error, MeshError) else WorkerFailed("worker failed")
    if batch.ended:
        raise WorkerFailed(ended)
