"""The multiplexed ``WorkerClient``: one long-lived ``GenerateStream`` per worker, shared by all requests.

The default (``--worker-transport mux``; ``unary`` is the per-request alternative). With per-request
streams a paced engine costs one gRPC message
per token per request on this hop; here the worker sends the tokens of every request that left the
same engine step in one message, and a demultiplexer task routes its chunks to per-request queues.
A request is a stream-local id: ``generate`` sends a start, ``cancel`` sends a cancel.

A stream that breaks (worker dead, frozen past the keepalive, restarted) fails every call still
open on it with the same ``WorkerFailed`` the unary client raises, so migration works unchanged;
the next ``generate`` for that address opens a fresh stream on the same channel. A draining worker
refuses new sequences (``WorkerFailed``, so they go elsewhere) and ends the stream once its running
ones finish (services/workers/mux.py): that ends the stream cleanly, as a broken one would end it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator

import grpc

from meshfront.worker.v1 import worker_pb2, worker_pb2_grpc
from services.common import tls as mesh_tls
from services.common.errors import Cancelled, Internal, MeshError, WorkerFailed, from_status_proto
from services.postprocessor.worker_client import WORKER_CHANNEL_OPTIONS, worker_error

log = logging.getLogger(__name__)

_END = object()


class MuxWorkerCall:
    """One sequence on a shared stream; the ``WorkerCall`` protocol."""

    __slots__ = ("_id", "_queue", "_stream", "done")

    def __init__(self, stream: _WorkerStream, seq_id: int):
        self._stream = stream
        self._id = seq_id
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self.done = False

    async def read(self) -> worker_pb2.GenerateResponse | None:
        item = await self._queue.get()
        if item is _END:
            self._queue.put_nowait(_END)  # every later read sees the end too
            return None
        if isinstance(item, MeshError):
            raise item
        return item  # type: ignore[return-value]

    def cancel(self) -> None:
        if not self.done:
            self.done = True
            self._stream.cancel(self._id)
            self._queue.put_nowait(_END)  # our own cancel ends the call cleanly, as in the unary client

    def deliver(self, item: object) -> None:
        self._queue.put_nowait(item)


class _WorkerStream:
    """The bidi stream to one worker and the task that demultiplexes it."""

    def __init__(self, stub: worker_pb2_grpc.WorkerServiceStub, address: str):
        self.address = address
        self._calls: dict[int, MuxWorkerCall] = {}
        self._ids = itertools.count(1)
        self._outgoing: asyncio.Queue[worker_pb2.GenerateStreamRequest | None] = asyncio.Queue()
        self._call = stub.GenerateStream(self._requests())
        self.broken = False
        self._task = asyncio.create_task(self._demux())
        log.info("opened a GenerateStream to worker %s", address)

    def start(self, request: worker_pb2.GenerateRequest) -> MuxWorkerCall:
        seq_id = next(self._ids)
        call = self._calls[seq_id] = MuxWorkerCall(self, seq_id)
        self._outgoing.put_nowait(worker_pb2.GenerateStreamRequest(
            start=worker_pb2.GenerateStreamStart(id=seq_id, request=request)))
        return call

    def cancel(self, seq_id: int) -> None:
        if self._calls.pop(seq_id, None) is not None and not self.broken:
            self._outgoing.put_nowait(worker_pb2.GenerateStreamRequest(
                cancel=worker_pb2.GenerateStreamCancel(id=seq_id)))

    async def _requests(self) -> AsyncIterator[worker_pb2.GenerateStreamRequest]:
        while (action := await self._outgoing.get()) is not None:
            yield action

    async def _demux(self) -> None:
        calls = self._calls
        error: MeshError = WorkerFailed("worker ended the stream")
        try:
            while (message := await self._call.read()) is not grpc.aio.EOF:
                for chunk in message.chunks:
                    call = calls.get(chunk.id)
                    if call is None:
                        continue  # cancelled by us; the worker had sent it already
                    if chunk.HasField("error"):
                        call.deliver(_chunk_error(chunk.error, self.address))
                    else:
                        call.deliver(chunk.response)
                        if not chunk.response.finish_reason:
                            continue
                        call.deliver(_END)
                    call.done = True
                    del calls[chunk.id]
            log.warning("worker %s ended its GenerateStream", self.address)
        except grpc.aio.AioRpcError as e:
            error = worker_error(e, self.address)
        except asyncio.CancelledError:
            error = WorkerFailed("worker client closed")
            raise
        finally:
            self._fail_all(error)

    def _fail_all(self, error: MeshError) -> None:
        """Every open call fails with ``error``; the stream is not used again."""
        self.broken = True
        calls, self._calls = self._calls, {}
        for call in calls.values():
            call.done = True
            call.deliver(error)
        self._outgoing.put_nowait(None)

    async def close(self) -> None:
        self._call.cancel()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


class MuxWorkerClient:
    """Opens sequences over one ``GenerateStream`` per worker address (channels as in the unary client)."""

    def __init__(self, tls: mesh_tls.MeshTls | None = None) -> None:
        self._tls = tls
        self._stubs: dict[str, worker_pb2_grpc.WorkerServiceStub] = {}
        self._streams: dict[str, _WorkerStream] = {}
        self._channels: list[grpc.aio.Channel] = []

    def generate(self, address: str, request: worker_pb2.GenerateRequest) -> MuxWorkerCall:
        stream = self._streams.get(address)
        if stream is None or stream.broken:  # reconnect on next use
            stream = self._streams[address] = _WorkerStream(self._stub(address), address)
        return stream.start(request)

    def _stub(self, address: str) -> worker_pb2_grpc.WorkerServiceStub:
        stub = self._stubs.get(address)
        if stub is None:
            channel = mesh_tls.channel(address, WORKER_CHANNEL_OPTIONS, self._tls)
            self._channels.append(channel)
            stub = self._stubs[address] = worker_pb2_grpc.WorkerServiceStub(channel)
        return stub

    async def close(self) -> None:
        """Ends every stream (open calls fail) and closes the channels."""
        streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            await stream.close()
        channels, self._channels, self._stubs = self._channels, [], {}
        for channel in channels:
            await channel.close()


def _chunk_error(status, address: str) -> MeshError:
    """A sequence's failure, mapped as the unary client maps a failed call (``worker_error``)."""
    err = from_status_proto(status)
    if isinstance(err, (WorkerFailed, Cancelled, Internal)):
        log.warning("worker %s failed a sequence: %s", address, err.message)
        return WorkerFailed(f"worker failed ({err.reason})")
    return err
