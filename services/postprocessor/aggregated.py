"""The aggregated attempt (the whole sequence on one worker), and how any worker call becomes responses.

``CallReader`` turns one worker call's messages into the request's responses: it is the aggregated attempt's
whole work, and each split attempt's decode leg (disagg_legs.py, disagg_paired.py) runs through it too. The
``FlushRule`` decides when the messages gathered so far leave as one response.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator

from meshfront.common.v1 import common_pb2
from meshfront.postprocessor.v1 import postprocessor_pb2
from meshfront.worker.v1 import worker_pb2

from services.common.errors import MeshError, WorkerFailed
from services.common.pump import Batch
from services.postprocessor.attempt import WorkerCall, WorkerClient
from services.postprocessor.idle_watch import IdleWatch
from services.postprocessor.migration import WorkerRoute
from services.postprocessor.response_builder import ResponseBuilder

log = logging.getLogger(__name__)


class FlushRule:
    """When the worker messages gathered for a response leave as one (the request's ``stream_interval``).

    The rule: with a stream interval of 1, whatever one read brought goes out at once. Above 1, messages wait
    until they carry at least ``stream_interval`` tokens; but the first response (it carries the usage fields),
    a message with a finish reason, and the end or failure of the worker's stream never wait.
    """

    __slots__ = ("_builder", "_held", "_interval", "_tokens")

    def __init__(self, stream_interval: int, builder: ResponseBuilder):
        self._interval = stream_interval
        self._builder = builder
        self._held: list[worker_pb2.GenerateResponse] = []  # messages not yet built into a response
        self._tokens = 0  # their token count, kept as they come (summing them per batch was 10 % of a profile)

    def take(self, batch: Batch[worker_pb2.GenerateResponse]) -> list[worker_pb2.GenerateResponse]:
        """The messages to build into a response now (every one held, ``batch``'s last); empty: none yet."""
        if self._interval <= 1:
            return batch.messages
        held = self._held
        held.extend(batch.messages)
        self._tokens += sum(len(m.token_ids) for m in batch.messages)
        if held and (self._tokens >= self._interval or self._builder.first or batch.error is not None
                     or batch.ended or held[-1].finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED):
            self._held, self._tokens = [], 0
            return held
        return []


class CallReader:
    """Turns a worker call's messages into the request's responses: through the request's builder, as the flush
    rule lets them out, and under the idle watch (``None``: off) from the call's first tokens on."""

    def __init__(self, builder: ResponseBuilder, stream_interval: int, idle: IdleWatch | None):
        self.builder = builder
        self._interval = stream_interval
        self._idle = idle

    async def responses(self, address: str, call: WorkerCall,
                        ) -> AsyncGenerator[postprocessor_pb2.GenerateResponse, None]:
        """Reads ``call`` (on the worker at ``address``) until the sequence finished; a ``MeshError`` when the
        call fails or ends without a finish reason. The call is cancelled when this ends, also when the caller
        closes it: the worker must stop generating at once."""
        builder, idle = self.builder, self._idle
        flush = FlushRule(self._interval, builder)
        watched = None  # the prefill is not timed: the watch starts with the first tokens
        try:
            batch = await call.next_batch()
            watched = idle.watch(address, call.fail) if idle is not None else None
            while True:
                messages = flush.take(batch)
                if messages:
                    response = builder.build(messages)
                    if response is not None:
                        yield response
                    if builder.decoder.finish is not None:
                        return
                if batch.error is not None or batch.ended:
                    raise _stream_error(batch, address)
                if watched is not None:
                    watched.waiting()
                batch = await call.next_batch()
                if watched is not None:
                    watched.got()
        finally:
            if watched is not None and idle is not None:
                idle.forget(watched)
            call.cancel()


class AggregatedAttempt:
    """The whole sequence on the route's decode worker: a route without a prefill worker, or a guided request
    (its grammar state cannot pass from a prefill worker to a decode worker, so the decode worker runs it whole)."""

    def __init__(self, route: WorkerRoute, request: common_pb2.PreprocessedRequest, workers: WorkerClient,
                 reader: CallReader):
        self.blamed = route.worker_id
        self._address = route.address
        self._request = request
        self._workers = workers
        self._reader = reader

    def responses(self) -> AsyncGenerator[postprocessor_pb2.GenerateResponse, None]:
        request = worker_pb2.GenerateRequest()
        request.request.CopyFrom(self._request)  # one copy: GenerateRequest(request=...) costs two (upb)
        call = self._workers.generate(self._address, request)
        return self._reader.responses(self._address, call)


def _stream_error(batch: Batch[worker_pb2.GenerateResponse], address: str) -> MeshError:
    """Why a call's stream ended before the sequence finished. Errors with a domain reason pass through;
    anything else means the worker failed."""
    if batch.error is None:
        return WorkerFailed("worker ended the stream without a finish reason")
    if isinstance(batch.error, MeshError):
        return batch.error
    log.warning("worker %s stream failed: %r", address, batch.error)
    return WorkerFailed("worker failed")
