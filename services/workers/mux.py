"""Many sequences over one stream: the worker side of ``GenerateStream`` (no grpc here).

A paced engine hands every running sequence one token per step, so per-request streams send one
message per token per request, and per-message cost dominates the mesh (bench/RESULTS.md). Here
each started sequence runs through the same ``WorkerService.generate`` path in its own task, and a
single writer sends everything that is ready across all of them as ONE ``GenerateStreamResponse``.
A sequence does not pull its next output until its previous chunk has been written, so while the
transport is busy its tokens pile up in the engine's ``TokenStream`` and the next message carries
them all (the same back-pressure the unary ``Generate`` gets from ``context.write``).

A cancel message, or the stream ending under us (the caller went away), aborts the affected
sequences through ``aclose()``, which logs "aborted by the caller" and frees their KV blocks.

A draining worker (SIGTERM) refuses new sequences on the stream with WORKER_FAILED, which the
postprocessor answers by routing them elsewhere, lets the running ones finish, and then ends the
stream itself, so the server stops as soon as its work is done instead of after the whole grace
period with the stream's last sequences failed into migration.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from meshfront.worker.v1 import worker_pb2

from services.common.errors import Internal, InvalidRequest, MeshError, WorkerFailed, status_proto
from services.workers.service import WorkerService

log = logging.getLogger(__name__)

Write = Callable[[worker_pb2.GenerateStreamResponse], Awaitable[object]]


class MuxSession:
    """Serves one ``GenerateStream`` call: a reader of actions, a task per sequence, one writer.

    Args:
        service: the worker whose ``generate`` every sequence goes through.
        write: sends one response (``context.write``); never called concurrently.
    """

    def __init__(self, service: WorkerService, write: Write):
        self._service = service
        self._write = write
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._outbox: list[tuple[int, worker_pb2.GenerateResponse | None, MeshError | None]] = []
        self._ready = asyncio.Event()
        # One event per message: its sequences wait for it (an Event, so that cancelling one waiter
        # cannot cancel what the others wait on, as a shared future would).
        self._flushed = asyncio.Event()
        self._reading = True
        self._draining = False
        self.messages_sent = 0

    async def run(self, actions: AsyncIterator[worker_pb2.GenerateStreamRequest]) -> None:
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

    async def _read(self, actions: AsyncIterator[worker_pb2.GenerateStreamRequest]) -> None:
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

    def _start(self, seq_id: int, request: worker_pb2.GenerateRequest) -> None:
        if self._draining:
            self._post(seq_id, None, WorkerFailed("the worker is draining; retry on another worker"))
            return
        if seq_id in self._tasks:
            self._post(seq_id, None, InvalidRequest(f"sequence id {seq_id} is already running on this stream"))
            return
        self._tasks[seq_id] = asyncio.create_task(self._sequence(seq_id, request))

    async def _sequence(self, seq_id: int, request: worker_pb2.GenerateRequest) -> None:
        responses = self._service.generate(request)
        try:
            async for response in responses:
                await self._post(seq_id, response, None).wait()
        except MeshError as e:
            self._post(seq_id, None, e)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("GenerateStream sequence %s failed", request.request.request_id)
            self._post(seq_id, None, Internal("internal worker error"))
        finally:
            await responses.aclose()  # on a cancel: aborts the sequence (and logs it) at once
            if self._tasks.get(seq_id) is asyncio.current_task():
                del self._tasks[seq_id]
                self._ready.set()  # the writer may be waiting for the last sequence to end

    def _post(self, seq_id: int, response: worker_pb2.GenerateResponse | None,
              error: MeshError | None) -> asyncio.Event:
        """Queues a chunk; the returned event is set once the message holding it was written."""
        self._outbox.append((seq_id, response, error))
        self._ready.set()
        return self._flushed

    async def _write_loop(self) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            if not self._outbox:
                if not self._tasks and (not self._reading or self._draining):
                    return
                continue
            chunks, self._outbox = self._outbox, []
            flushed, self._flushed = self._flushed, asyncio.Event()
            message = worker_pb2.GenerateStreamResponse()
            add = message.chunks.add
            for seq_id, response, error in chunks:
                if error is None:
                    add(id=seq_id, response=response)
                else:
                    add(id=seq_id, error=status_proto(error))
            await self._write(message)
            self.messages_sent += 1
            flushed.set()
