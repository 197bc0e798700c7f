"""The postprocessor's ``WorkerClient``: one long-lived ``GenerateStream`` per worker, shared by all requests.

A channel per worker address (an HTTP/2 connection, created on first use, pinged so that a frozen
worker is found out in about 2 s, no transparent retries) carries one bidi stream, on which the worker
sends the tokens of every request that left the same engine step in one message
(services/common/mux_client.py demultiplexes them). A
stream per request (``--worker-transport unary``) cost one gRPC message per token per request on this
hop; it was measured against this and removed (bench/RESULTS.md).

A broken stream fails every call still open on it with ``WorkerFailed``, so each migrates; the next
``generate`` for that address opens a fresh stream on the same channel. A draining worker refuses new
sequences (``WorkerFailed`` here, so they migrate to another worker) and ends the stream once its
running ones finish.
"""

from __future__ import annotations

import logging

import grpc
from google.rpc import status_pb2
from meshfront.worker.v1 import worker_pb2, worker_pb2_grpc

from services.common import tls as mesh_tls
from services.common.errors import (
    Cancelled,
    Draining,
    Internal,
    MeshError,
    WorkerFailed,
    from_rpc_error,
    from_status_proto,
)
from services.common.grpc_server import PINGED_CHANNEL_OPTIONS
from services.common.mux_client import MuxCall, MuxStream, Wire

log = logging.getLogger(__name__)


# What the client reads: the transport's status and the worker's reason name gRPC and our wire, so they go to the
# log (with the worker's address) only.
WORKER_FAILED = "The worker serving this request failed."


def worker_error(e: grpc.aio.AioRpcError, address: str) -> MeshError:
    """Maps a failed worker call to the error the postprocessor raises.

    A worker that rejects a request with one of our reasons (invalid request, overloaded) keeps
    that reason. Anything else (a dead or unreachable worker, a crash, a worker-side cancel while we
    were still reading) is ``WorkerFailed``, which the gateway maps to 503 and a later migration
    will retry elsewhere. The transport's details name hosts, so they go to the log, not the client.
    """
    err = from_rpc_error(e)
    if isinstance(err, (WorkerFailed, Cancelled, Internal)):
        log.warning("worker %s failed: %s %s", address, e.code().name, e.details())
        return WorkerFailed(WORKER_FAILED)
    return err


def _chunk_error(status: status_pb2.Status, address: str) -> MeshError:
    """A sequence's failure, mapped as a broken stream is (``worker_error``)."""
    err = from_status_proto(status)
    if isinstance(err, (WorkerFailed, Draining, Cancelled, Internal)):
        log.warning("worker %s failed a sequence: %s", address, err.message)
        # The param survives: kv_transfer_params says a decode leg's prefill worker, not this one, failed.
        return WorkerFailed(WORKER_FAILED, param=err.param)
    return err


def _start(seq_id: int, request: worker_pb2.GenerateRequest) -> worker_pb2.GenerateStreamRequest:
    """Filled in place: nested constructors copy the prompt at every level (0.4 ms at 6k tokens, one copy 0.1)."""
    message = worker_pb2.GenerateStreamRequest()
    message.start.id = seq_id
    message.start.request.CopyFrom(request)
    return message


def _wire(stub: worker_pb2_grpc.WorkerServiceStub) -> Wire:
    return Wire(
        open=stub.GenerateStream,
        start=_start,
        cancel=lambda seq_id: worker_pb2.GenerateStreamRequest(cancel=worker_pb2.GenerateStreamCancel(id=seq_id)),
        stream_error=worker_error, chunk_error=_chunk_error,
        ended=lambda address: WorkerFailed("worker ended the stream"), peer="worker")


class MuxWorkerClient:
    """Opens sequences over one ``GenerateStream`` per worker address, on one channel per address."""

    def __init__(self, tls: mesh_tls.MeshTls | None = None) -> None:
        self._tls = tls
        self._wires: dict[str, Wire] = {}
        self._streams: dict[str, MuxStream] = {}
        self._channels: list[grpc.aio.Channel] = []

    def generate(self, address: str, request: worker_pb2.GenerateRequest) -> MuxCall[worker_pb2.GenerateResponse]:
        stream = self._streams.get(address)
        if stream is None or not stream.usable:  # reconnect on next use; a draining worker's stream ends alone
            stream = self._streams[address] = MuxStream(self._wire(address), address)
        return stream.start(request)

    def _wire(self, address: str) -> Wire:
        wire = self._wires.get(address)
        if wire is None:
            channel = mesh_tls.channel(address, PINGED_CHANNEL_OPTIONS, self._tls)  # a frozen worker's streams migrate
            self._channels.append(channel)
            wire = self._wires[address] = _wire(worker_pb2_grpc.WorkerServiceStub(channel))
        return wire

    async def close(self) -> None:
        """Ends every stream (open calls fail) and closes the channels."""
        streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            await stream.close()
        channels, self._channels, self._wires = self._channels, [], {}
        for channel in channels:
            await channel.close()
