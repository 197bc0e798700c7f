"""The gateway's client of media workers: one channel per worker address, shared by all requests.

A picture has no tokens for the postprocessor, so the gateway itself calls ``MediaService.GenerateMedia``
on the worker the router chose, as it calls ``Embed`` for embeddings. Failures keep their meaning: a
worker's 400 stays a 400 and its overload a 503; a dead, frozen or unreachable worker is ``WorkerFailed``,
which the pipeline retries once on another worker while nothing has reached the client.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Protocol

import grpc
from meshfront.worker.v1 import media_pb2, media_pb2_grpc

from services.common import tls as mesh_tls
from services.common.grpc_server import PINGED_CHANNEL_OPTIONS
from services.gateway.core.worker_errors import worker_error

# Pinged like every channel to a worker (PINGED_CHANNEL_OPTIONS): a frozen worker fails the call within ~3 s.
# A fixed receive window of two chunks: gRPC's default grows the window with its bandwidth estimate (BDP
# probes), so a worker that sends faster than the client reads filled the gateway with most of a 50 MB video
# (bench: `python -m bench media-transfer`); bounded, the worker waits and the gateway holds about two chunks.
MEDIA_RECEIVE_WINDOW = 2 * 1024 * 1024
MEDIA_CHANNEL_OPTIONS = [*PINGED_CHANNEL_OPTIONS, ("grpc.http2.bdp_probe", 0),
                         ("grpc.http2.lookahead_bytes", MEDIA_RECEIVE_WINDOW)]


class MediaWorkerClient(Protocol):
    def generate(self, address: str,
                 req: media_pb2.GenerateMediaRequest) -> AsyncGenerator[media_pb2.GenerateMediaResponse, None]: ...


class GrpcMediaWorker:
    def __init__(self, tls: mesh_tls.MeshTls | None = None) -> None:
        self._tls = tls
        self._stubs: dict[str, media_pb2_grpc.MediaServiceStub] = {}
        self._channels: list[grpc.aio.Channel] = []

    def _stub(self, address: str) -> media_pb2_grpc.MediaServiceStub:
        stub = self._stubs.get(address)
        if stub is None:
            channel = mesh_tls.channel(address, MEDIA_CHANNEL_OPTIONS, self._tls)
            self._channels.append(channel)
            stub = self._stubs[address] = media_pb2_grpc.MediaServiceStub(channel)
        return stub

    async def generate(self, address: str,
                       req: media_pb2.GenerateMediaRequest) -> AsyncGenerator[media_pb2.GenerateMediaResponse, None]:
        """The worker's events in order. Closing this iterator early (the client hung up) cancels the call,
        which is what stops the worker's denoising loop."""
        call = self._stub(address).GenerateMedia(req)
        try:
            async for event in call:
                yield event
        except grpc.aio.AioRpcError as e:
            raise worker_error(e, address, "media") from None
        finally:
            call.cancel()  # a no-op once the call ended; otherwise the worker hears the hang-up

    async def close(self) -> None:
        channels, self._channels, self._stubs = self._channels, [], {}
        for channel in channels:
            await channel.close()
