"""Many sequences over one stream: the serving side of a ``GenerateStream`` (no grpc here).

A paced engine hands every running sequence one token per step, so per-request streams send one
message per token per request, and per-message cost dominates the mesh (bench/RESULTS.md). Here
each started sequence runs through the service's ordinary ``generate`` path in its own task, and a
single writer sends everything that is ready across all of them as ONE response message. A sequence
does not pull its next output until its previous chunk has been written, so while the transport is
busy its output piles up below it and the next message carries it all (the same back-pressure a
per-request stream gets from ``context.write``).

Two hops use it: the worker's ``WorkerService.GenerateStream`` (the postprocessor calls it) and the
postprocessor's ``PostprocessorService.GenerateStream`` (the gateway calls it). Both protos have the
same shape: a start (id, request) or a cancel (id) in, ``chunks`` of (id, response | error) out.

A cancel message, or the stream ending under us (the caller went away), aborts the affected
sequences through ``aclose()``, which stops the work below them at once.

A draining server (SIGTERM) refuses new sequences on the stream with ``Draining``, which the caller
answers by starting them on another replica, lets the running ones finish, and then ends the stream
itself, so the server stops as soon as its work is done instead of after the whole grace period with
the stream's last sequences failed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, Generic, Protocol, TypeVar

from services.common.errors import Draining, Internal, InvalidRequest, MeshError, status_proto
from services.common.metrics import mux_metrics

log = logging.getLogger(__name__)


class _Sequence(Protocol):
    """What a start carries: a request whose ``request.request_id`` names it in logs."""

    @property
    def request(self) -> Any: ...


Req = TypeVar("Req", bound=_Sequence)
Resp = TypeVar("Resp")
Write = Callable[[Any], Awaitable[object]]


class MuxSession(Generic[Req, Resp]):
    """Serves one ``GenerateStream`` call: a reader of actions, a task per sequence, one writer.

    Args:
        generate: the service's per-request generator every sequence goes through.
        write: sends one response message (``context.write``); never called concurrently.
        message: makes an empty response message (its ``chunks.add(id=, response=|error=)``).
        rpc: names the stream in the ``meshfront_mux_*`` metrics (``worker.GenerateStream`` ...).
    """

    def __init__(self, generate: Callable[[Req], AsyncGenerator[Resp, None]], write: Write,
                 message: Callable[[], Any], rpc: str):
        self._generate = generate
        self._write = write
        self._message = message
        metrics = mux_metrics()
        self._messages_sent = metrics.messages.labels(rpc)
        self._chunks_sent = metrics.chunks.labels(rpc)
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._outbox: list[tuple[int, Resp | None, MeshError | None]] = []
        self._ready = asyncio.Event()
        # One event per message: its sequences wait for it (an Event, so that cancelling one waiter
        # cannot cancel what the others wait on, as a shared future would).
        self._flushed = asyncio.Event()
        self._reading = True
        self._draining = False

    async def run(self, actions: AsyncIterator[Any]) -> None:
        """Serves until the caller half-closes and every sequence ended, or until cancelled."""
        reader = asyncio.create_task(self._read(actions))
        try:
            await self._write_loop()
            if not self._draining:
                await reader  # re-raises a failed read
        finally:
            reader.cancel()
            for task in list(self._tasks.values()):
                task.cancel()  # the caller is gone: abort every sequence now
            if self._tasks:
                await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    async def _read(self, actions: AsyncIterator[Any]) -> None:
        try:
            async for action in actions:
                if action.HasField("start"):
                    self._start(action.start.id, action.start.request)
                elif action.HasField("cancel"):
                    task = self._tasks.pop(action.cancel.id, None)
                    if task is not None:
                        task.cancel()
        finally:
            self._reading = False
            self._ready.set()  # lets the writer notice the end

    def drain(self) -> None:
        """No new sequences; the stream ends once the running ones have."""
        self._draining = True
        self._ready.set()

    def _start(self, seq_id: int, request: Req) -> None:
        if self._draining:
            self._post(seq_id, None, Draining("this replica is draining; start the sequence on another"))
            return
        if seq_id in self._tasks:
            self._post(seq_id, None, InvalidRequest(f"sequence id {seq_id} is already running on this stream"))
            return
        self._tasks[seq_id] = asyncio.create_task(self._sequence(seq_id, request))

    async def _sequence(self, seq_id: int, request: Req) -> None:
        responses = self._generate(request)
        try:
            async for response in responses:
                # Not pulling the next output until this chunk is out lets a fast engine's tokens pile up
                # below meanwhile: going straight on (one wake-up less per token) cost a third more
                # messages at c=1 with a fast engine (bench/RESULTS.md).
                await self._post(seq_id, response, None).wait()
        except MeshError as e:
            self._post(seq_id, None, e)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("GenerateStream sequence %s failed", request.request.request_id)
            self._post(seq_id, None, Internal("internal error"))
        finally:
            await responses.aclose()  # on a cancel: aborts the sequence (and logs it) at once
            if self._tasks.get(seq_id) is asyncio.current_task():
                del self._tasks[seq_id]
                self._ready.set()  # the writer may be waiting for the last sequence to end

    def _post(self, seq_id: int, response: Resp | None,
              error: MeshError | None) -> asyncio.Event:
        """Queues a chunk; the returned event is set once the message holding it was written."""
        self._outbox.append((seq_id, response, error))
        self._ready.set()
        return self._flushed

    async def _write_loop(self) -> None:
        while True:
            if not self._outbox:
                # Checked before every wait: the last sequence may have ended while a write was in flight.
                if not self._tasks and (not self._reading or self._draining):
                    return
                await self._ready.wait()
                self._ready.clear()
                continue
            chunks, self._outbox = self._outbox, []
            flushed, self._flushed = self._flushed, asyncio.Event()
            message = self._message()
            add = message.chunks.add
            for seq_id, response, error in chunks:
                if error is None:
                    add(id=seq_id, response=response)
                else:
                    add(id=seq_id, error=status_proto(error))
            await self._write(message)
            self._messages_sent.inc()
            self._chunks_sent.inc(len(chunks))
            flushed.set()


class MuxSessions:
    """The open sessions of one servicer, so that a drain reaches all of them."""

    def __init__(self) -> None:
        self._sessions: set[MuxSession] = set()
        self._draining = False

    async def serve(self, session: MuxSession, actions: AsyncIterator[Any]) -> None:
        """Runs ``session`` in the handler task: a caller's cancel lands here and aborts its sequences."""
        if self._draining:
            session.drain()  # a stream opened after the drain began refuses its starts too
        self._sessions.add(session)
        try:
            await session.run(actions)
        finally:
            self._sessions.discard(session)

    async def drain(self) -> None:
        """No session takes new sequences; each ends when its running ones have (a drain hook)."""
        self._draining = True
        for session in self._sessions:
            session.drain()
