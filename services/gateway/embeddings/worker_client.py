"""The gateway's client of embedding workers: one channel per worker address, shared by all requests.

Embeddings skip the postprocessor (nothing to detokenize or parse), so the gateway itself calls the
worker the router chose. Failures keep their meaning: a worker's 400 stays a 400; a dead, frozen or
unreachable worker (or one that is not an embedding worker after all) is ``WorkerFailed``, which the
pipeline retries once on another worker and otherwise answers 503.
"""

from __future__ import annotations

from typing import Protocol

import grpc
from meshfront.worker.v1 import worker_pb2, worker_pb2_grpc

from services.common import tls as mesh_tls
from services.common.grpc_server import PINGED_CHANNEL_OPTIONS
from services.gateway.core.worker_errors import worker_error


class EmbedWorkerClient(Protocol):
    async def embed(self, address: str, req: worker_pb2.EmbedRequest) -> worker_pb2.EmbedResponse: ...


class GrpcEmbedWorker:
    def __init__(self, tls: mesh_tls.MeshTls | None = None) -> None:
        self._tls = tls
        self._stubs: dict[str, worker_pb2_grpc.WorkerServiceStub] = {}
        self._channels: list[grpc.aio.Channel] = []

    async def embed(self, address: str, req: worker_pb2.EmbedRequest) -> worker_pb2.EmbedResponse:
        stub = self._stubs.get(address)
        if stub is None:
            channel = mesh_tls.channel(address, PINGED_CHANNEL_OPTIONS, self._tls)  # a frozen worker fails in ~2 s
            self._channels.append(channel)
            stub = self._stubs[address] = worker_pb2_grpc.WorkerServiceStub(channel)
        try:
            return await stub.Embed(req)
        except grpc.aio.AioRpcError as e:
            raise worker_error(e, address, "embedding") from None

    async def close(self) -> None:
        channels, self._channels, self._stubs = self._channels, [], {}
        for channel in channels:
            await channel.close()
