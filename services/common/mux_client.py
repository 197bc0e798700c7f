"""The calling side of a ``GenerateStream``: many requests over one long-lived bidi stream.

Two hops use it: the postprocessor to each worker (``WorkerService.GenerateStream``) and the gateway
to each postprocessor replica (``PostprocessorService.GenerateStream``). The peer sends the output of
every request that was ready at once in one message; a demultiplexer task routes its chunks to the
per-request ``MuxCall`` queues. A request is a stream-local id: ``start`` sends a start, ``cancel``
a cancel (services/common/mux_session.py is the serving side).

A stream that breaks (peer dead, frozen past the keepalive, restarted) fails every call still open
on it with the error ``Wire.stream_error`` makes of it, as a broken per-request stream would, and
is not used again; the owner opens a fresh one on the same channel for the next request. A peer
that drains refuses new starts (``Draining``) and ends the stream once its running calls finish.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, TypeVar

import grpc
from google.rpc import status_pb2

from services.common.assembly import cancel_within
from services.common.errors import Draining, MeshError
from services.common.pump import Batch, Inbox

log = logging.getLogger(__name__)

Resp = TypeVar("Resp")

_END = object()
# A stream with no open call for this long is half-closed (the owner opens a fresh one for the next request):
# an open call keeps its channel's keepalive pings going (PINGED_CHANNEL_OPTIONS), and an idle mesh should
# send none. Long enough that a steady trickle of requests keeps one stream; a new stream costs one round trip.
IDLE_CLOSE_S = 5.0


@dataclasses.dataclass(frozen=True)
class Wire:
    """How one service's ``GenerateStream`` protos and errors look.

    Attributes:
        open: starts the bidi call with an iterator of actions (``stub.GenerateStream``).
        start: the action that starts sequence ``id`` with a request.
        cancel: the action that aborts sequence ``id``.
        stream_error: what a broken stream means for its open calls.
        chunk_error: what a sequence's error status means for its caller.
        ended: what calls still open mean when the stream ended cleanly or was closed under them.
        peer: the kind of peer, for logs ("worker", "postprocessor").
    """

    open: Callable[[AsyncIterator[Any]], Any]
    start: Callable[[int, Any], Any]
    cancel: Callable[[int], Any]
    stream_error: Callable[[grpc.aio.AioRpcError, str], MeshError]
    chunk_error: Callable[[status_pb2.Status, str], MeshError]
    ended: Callable[[str], MeshError]
    peer: str


class MuxCall(Generic[Resp]):
    """One request on a shared stream: its responses in order, then the end or an error."""

    __slots__ = ("_id", "_inbox", "_stream", "deliver", "done")

    def __init__(self, stream: MuxStream, seq_id: int):
        self._stream = stream
        self._id = seq_id
        self._inbox = Inbox(_END)
        self.deliver = self._inbox.put  # the demultiplexer's per-chunk call: the inbox's own, no hop
        self.done = False

    async def next_batch(self) -> Batch[Resp]:
        """Every response that arrived since the last call (at least one), then the end (also after our
        own cancel) or the call's ``MeshError``."""
        batch: Batch[Resp] = await self._inbox.take()
        if batch.ended:
            self._inbox.put(_END)  # every later call sees the end too
        return batch

    def cancel(self) -> None:
        """Aborts the request at the peer; a no-op once it has ended."""
        if not self.done:
            self.done = True
            self._stream.cancel(self._id)
            self._inbox.put(_END)  # our own cancel ends the call cleanly, as a per-request cancel does

    def fail(self, error: MeshError) -> None:
        """Ends the call with ``error`` as its next outcome (the caller still cancels it at the peer)."""
        if not self.done:
            self._inbox.put(error)


class MuxStream:
    """The bidi stream to one peer and the task that demultiplexes it.

    Attributes:
        broken: the stream ended or failed; open a new one.
        draining: the peer refused a start because it is shutting down; start nothing more here.
        failure: once broken, the error its open calls got (tells a lost stream from a call's own error).
    """

    def __init__(self, wire: Wire, address: str):
        self.address = address
        self._wire = wire
        self._calls: dict[int, MuxCall] = {}
        self._ids = itertools.count(1)
        self._outgoing: asyncio.Queue[object] = asyncio.Queue()
        self._call = wire.open(self._actions())
        self.broken = False
        self.draining = False
        self.failure: MeshError | None = None
        self._idle: asyncio.TimerHandle | None = None
        self._task = asyncio.create_task(self._demux())
        log.info("opened a GenerateStream to %s %s", wire.peer, address)

    @property
    def open_calls(self) -> int:
        return len(self._calls)

    @property
    def usable(self) -> bool:
        return not (self.broken or self.draining)

    def start(self, request: object) -> MuxCall:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        seq_id = next(self._ids)
        call = self._calls[seq_id] = MuxCall(self, seq_id)
        self._outgoing.put_nowait(self._wire.start(seq_id, request))
        return call

    def cancel(self, seq_id: int) -> None:
        if self._calls.pop(seq_id, None) is not None and not self.broken:
            self._outgoing.put_nowait(self._wire.cancel(seq_id))
            self._idle_soon()

    def _idle_soon(self) -> None:
        """Arms the idle close once the last open call is done."""
        if not self._calls and self._idle is None and not self.broken:
            self._idle = asyncio.get_running_loop().call_later(IDLE_CLOSE_S, self._close_idle)

    def _close_idle(self) -> None:
        self._idle = None
        if self._calls or self.broken:
            return
        self.broken = True  # unusable from now: the next request opens a fresh stream
        self._outgoing.put_nowait(None)  # half-close; the peer ends the stream, which ends _demux

    async def _actions(self) -> AsyncIterator[object]:
        while (action := await self._outgoing.get()) is not None:
            yield action

    async def _demux(self) -> None:
        calls = self._calls
        wire = self._wire
        error: MeshError | None = None
        try:
            while (message := await self._call.read()) is not grpc.aio.EOF:
                for chunk in message.chunks:
                    call = calls.get(chunk.id)
                    if call is None:
                        continue  # cancelled by us; the peer had sent it already
                    if chunk.HasField("error"):
                        err = wire.chunk_error(chunk.error, self.address)
                        if isinstance(err, Draining):
                            self.draining = True
                        call.deliver(err)
                    else:
                        response = chunk.response
                        call.deliver(response)
                        if not response.finish_reason:
                            continue
                        call.deliver(_END)
                    call.done = True
                    del calls[chunk.id]
                if not calls:
                    self._idle_soon()
            if calls:
                log.warning("%s %s ended its GenerateStream with %d calls open", wire.peer, self.address,
                            len(calls))
        except grpc.aio.AioRpcError as e:
            error = wire.stream_error(e, self.address)
        except asyncio.CancelledError:
            raise
        finally:
            self._fail_all(error)

    def _fail_all(self, error: MeshError | None) -> None:
        """Every open call fails (with ``error``, or as a stream that ended under it); the stream is done."""
        self.broken = True
        self.failure = failure = error or self._wire.ended(self.address)
        calls, self._calls = self._calls, {}
        for call in calls.values():
            call.done = True
            call.deliver(failure)
        self._outgoing.put_nowait(None)

    async def close(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
        self._call.cancel()
        await cancel_within([self._task])
