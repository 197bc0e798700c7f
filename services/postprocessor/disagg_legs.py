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
in its leg's first chunk (transfer parameters before any token); the attempt then runs in the paired order
instead, both legs at once (disagg_paired.py).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable
from typing import Protocol

from meshfront.common.v1 import common_pb2
from meshfront.postprocessor.v1 import postprocessor_pb2
from meshfront.worker.v1 import worker_pb2

from services.common import tracing
from services.common.errors import InvalidRequest, MeshError, WorkerFailed
from services.common.pump import Batch
from services.postprocessor.disagg_common import TRANSFER_PARAM, Build, Decode, LegCall, Opener, drop_leg_budget
from services.postprocessor.disagg_paired import PairedLegs, announces_pairing
from services.postprocessor.migration import WorkerRoute, continuation


class KvReleaser(Protocol):
    """Frees blocks the route's prefill worker holds for a transfer, through whichever worker of the pair serves
    the release (kv_release.GrpcKvReleaser); never raises."""

    def release(self, route: WorkerRoute, model: str, kv_transfer_params: bytes) -> None: ...


def prefill_leg(request: common_pb2.PreprocessedRequest, route: WorkerRoute) -> common_pb2.PreprocessedRequest:
    leg = common_pb2.PreprocessedRequest()
    leg.CopyFrom(request)
    leg.stop.max_tokens = 1
    if leg.stop.HasField("min_tokens"):
        leg.stop.min_tokens = min(leg.stop.min_tokens, 1)
    leg.disaggregation.role = common_pb2.DISAGGREGATION_ROLE_PREFILL
    leg.disaggregation.peer_worker_id, leg.disaggregation.peer_address = route.worker_id, route.address
    return leg


def decode_leg(request: common_pb2.PreprocessedRequest, first: list[int], route: WorkerRoute,
               kv_transfer_params: bytes) -> common_pb2.PreprocessedRequest:
    leg = continuation(request, first)
    leg.disaggregation.role = common_pb2.DISAGGREGATION_ROLE_DECODE
    leg.disaggregation.kv_transfer_params = kv_transfer_params
    leg.disaggregation.peer_worker_id, leg.disaggregation.peer_address = route.prefill_worker_id, route.prefill_address
    return leg


class DisaggLegs:
    """Runs one disaggregated attempt, in the order its prefill worker asks for (sequential unless its first
    chunk announces the paired order, disagg_paired.py); ``blamed`` then says whose failure ended it."""

    def __init__(self, open_call: Opener, decode: Decode, releaser: KvReleaser):
        self._open = open_call
        self._decode = decode
        self._releaser = releaser
        self._paired: PairedLegs | None = None
        self._blamed = ""

    @property
    def blamed(self) -> str:
        return self._paired.blamed if self._paired is not None else self._blamed

    async def run(self, route: WorkerRoute, request: common_pb2.PreprocessedRequest,
                  build: Build,
                  generated: Callable[[], list[int]], finished: Callable[[], bool],
                  ) -> AsyncGenerator[postprocessor_pb2.GenerateResponse, None]:
        """Yields the request's responses from both legs. ``build`` feeds worker messages to the request's
        builder, ``generated`` is its decoder's ids so far and ``finished`` whether it ended the sequence."""
        before = len(generated())
        self._blamed = route.prefill_worker_id
        call = self._open(route.prefill_address, worker_pb2.GenerateRequest(request=prefill_leg(request, route)))
        try:
            messages = await self._first(call)
            if announces_pairing(messages[0]):
                self._paired = PairedLegs(self._open, self._decode)
                async for response in self._paired.run(route, request, call, messages[0], messages[1:], build,
                                                       finished):
                    yield response
                return
            messages = await self._prefill(call, messages)
        finally:
            # A cancel here (the client left mid-prefill) aborts the sequence on the worker, blocks and all.
            call.cancel()  # a no-op once the leg ended
        async for response in self._sequential(route, request, messages, before, build, generated, finished):
            yield response

    async def _sequential(self, route: WorkerRoute, request: common_pb2.PreprocessedRequest,
                          messages: list[worker_pb2.GenerateResponse], before: int,
                          build: Build,
                          generated: Callable[[], list[int]], finished: Callable[[], bool],
                          ) -> AsyncGenerator[postprocessor_pb2.GenerateResponse, None]:
        """The decode leg after the prefill leg's ``messages`` (up to its finishing one)."""
        params = messages[-1].kv_transfer_params
        ended_at = time.monotonic()
        ended_ns = time.time_ns() if tracing.ENABLED else 0  # the trace's transfer span starts here
        drop_leg_budget(messages, request)
        decode_call = None
        decoding = False  # the decode worker sent its first chunk: it pulled the blocks
        try:
            response = build(messages)
            if not finished():
                if not params:
                    raise WorkerFailed("the prefill worker returned no KV transfer parameters")
                leg = decode_leg(request, generated()[before:], route, params)
                # Opened before the first token is handed on: the transfer overlaps the client's first chunk.
                decode_call = self._open(route.address, worker_pb2.GenerateRequest(request=leg))
            if response is not None:
                yield response
            if decode_call is None:
                return
            self._blamed = route.worker_id
            async for response in self._decode(route.address, leg, decode_call):
                if not decoding:
                    decoding = True
                    response.worker_id, response.prefill_worker_id = route.worker_id, route.prefill_worker_id
                    response.kv_transfer_ms = round((time.monotonic() - ended_at) * 1000, 3)
                    if ended_ns:
                        _transfer_span(request.traceparent, ended_ns, route)
                yield response
        except MeshError as e:
            if not decoding and e.param == TRANSFER_PARAM and isinstance(e, (WorkerFailed, InvalidRequest)):
                self._blamed = route.prefill_worker_id  # its blocks are gone, not the decode worker
                raise WorkerFailed("the KV transfer from the prefill worker failed") from e
            raise
        finally:
            if decode_call is not None:
                decode_call.cancel()  # a no-op once the leg ended
            if params and not decoding:
                self._releaser.release(route, request.model, params)

    @staticmethod
    async def _first(call: LegCall) -> list[worker_pb2.GenerateResponse]:
        """The prefill leg's first messages (at least one)."""
        while True:
            batch = await call.next_batch()
            if batch.messages:
                return batch.messages
            _check(batch, ended="the prefill worker ended the stream without a finish reason")

    @staticmethod
    async def _prefill(call: LegCall, messages: list[worker_pb2.GenerateResponse]) -> list[worker_pb2.GenerateResponse]:
        """The prefill leg's messages, from ``messages`` (read already) up to and including its finishing one."""
        while messages[-1].finish_reason == common_pb2.FINISH_REASON_UNSPECIFIED:
            batch = await call.next_batch()
            messages.extend(batch.messages)
            if messages[-1].finish_reason == common_pb2.FINISH_REASON_UNSPECIFIED:
                _check(batch, ended="the prefill worker ended the stream without a finish reason")
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
