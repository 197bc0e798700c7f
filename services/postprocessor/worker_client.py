"""The gRPC ``WorkerClient``: one channel per worker address, shared by all requests to it.

A channel is an HTTP/2 connection that multiplexes every stream to that worker, so a new request
costs a stream, not a handshake. Channels are created lazily with the mesh-wide
``CHANNEL_OPTIONS`` (keepalive that notices a dead worker within seconds, no transparent retries)
and are closed with the client.
"""

from __future__ import annotations

import logging
from typing import cast

import grpc

from meshfront.worker.v1 import worker_pb2, worker_pb2_grpc
from services.common import tls as mesh_tls
from services.common.error_interceptor import request_id_metadata
from services.common.errors import Cancelled, Internal, MeshError, WorkerFailed, from_rpc_error
from services.common.grpc_server import CHANNEL_OPTIONS
from services.common.pump import StreamPump

log = logging.getLogger(__name__)

# A frozen worker (SIGSTOP, a wedged host) keeps its TCP connection open and simply stops talking.
# Pinging every second and giving up 2 s later fails its streams within ~3 s, so they migrate
# instead of hanging; pings continue while a stream waits in a long prefill (no data either way).
WORKER_CHANNEL_OPTIONS = [
    *(o for o in CHANNEL_OPTIONS if o[0] not in ("grpc.keepalive_time_ms", "grpc.keepalive_timeout_ms")),
    ("grpc.keepalive_time_ms", 1_000),
    ("grpc.keepalive_timeout_ms", 2_000),
    ("grpc.http2.max_pings_without_data", 0),
]


class GrpcWorkerCall:
    """A running ``Generate`` call; failures become ``MeshError``."""

    def __init__(self, call: grpc.aio.UnaryStreamCall, address: str):
        self._call = call
        self._address = address
        self._cancelled = False

    async def read(self) -> worker_pb2.GenerateResponse | None:
        try:
            message = await self._call.read()
        except grpc.aio.AioRpcError as e:
            if self._cancelled and e.code() == grpc.StatusCode.CANCELLED:
                return None  # our own cancel (stop string, client gone), not a worker failure
            raise worker_error(e, self._address) from None
        return None if message is grpc.aio.EOF else cast(worker_pb2.GenerateResponse, message)

    def cancel(self) -> None:
        self._cancelled = True
        self._call.cancel()


class GrpcWorkerClient:
    """Opens Generate calls over a pool of channels keyed by worker address."""

    def __init__(self, tls: mesh_tls.MeshTls | None = None) -> None:
        self._tls = tls
        self._stubs: dict[str, worker_pb2_grpc.WorkerServiceStub] = {}
        self._channels: list[grpc.aio.Channel] = []

    def generate(self, address: str, request: worker_pb2.GenerateRequest) -> StreamPump[worker_pb2.GenerateResponse]:
        stub = self._stubs.get(address)
        if stub is None:
            channel = mesh_tls.channel(address, WORKER_CHANNEL_OPTIONS, self._tls)
            self._channels.append(channel)
            stub = self._stubs[address] = worker_pb2_grpc.WorkerServiceStub(channel)
        call = GrpcWorkerCall(stub.Generate(request, metadata=request_id_metadata(request.request.request_id)),
                              address)
        return StreamPump(call.read, call.cancel)  # reads ahead, so that what is ready leaves as one response

    async def close(self) -> None:
        """Closes every channel (in-flight calls are cancelled)."""
        channels, self._channels, self._stubs = self._channels, [], {}
        for channel in channels:
            await channel.close()


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
        return WorkerFailed(f"worker failed ({e.code().name})")
    return err
