"""Frees the KV blocks a prefill worker holds for a decode leg that will never come (``KvTransferService.
ReleaseKv`` on the prefill worker's port), so that a client's hang-up between the legs frees the prefill
worker at once instead of after its hold timeout.

Fire and forget: the request that asked is over; a worker that does not hold blocks itself (a real engine
whose connector moves them: UNIMPLEMENTED) or is gone simply times the hold out.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
from meshfront.worker.v1 import kv_transfer_pb2, kv_transfer_pb2_grpc

from services.common import tls as mesh_tls
from services.common.grpc_server import CHANNEL_OPTIONS

log = logging.getLogger(__name__)

_RELEASE_TIMEOUT_S = 1.0


class GrpcKvReleaser:
    """One channel per prefill worker address, opened on first use."""

    def __init__(self, tls: mesh_tls.MeshTls | None = None):
        self._tls = tls
        self._stubs: dict[str, kv_transfer_pb2_grpc.KvTransferServiceStub] = {}
        self._channels: list[grpc.aio.Channel] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def release(self, address: str, kv_transfer_params: bytes) -> None:
        task = asyncio.get_running_loop().create_task(self._release(address, kv_transfer_params))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _release(self, address: str, kv_transfer_params: bytes) -> None:
        stub = self._stubs.get(address)
        if stub is None:
            channel = mesh_tls.channel(address, CHANNEL_OPTIONS, self._tls)
            self._channels.append(channel)
            stub = self._stubs[address] = kv_transfer_pb2_grpc.KvTransferServiceStub(channel)
        try:
            await stub.ReleaseKv(kv_transfer_pb2.ReleaseKvRequest(kv_transfer_params=kv_transfer_params),
                                 timeout=_RELEASE_TIMEOUT_S)
        except grpc.aio.AioRpcError as e:
            log.info("releasing held KV blocks on %s failed (%s); they time out there", address, e.code().name)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        channels, self._channels, self._stubs = self._channels, [], {}
        for channel in channels:
            await channel.close()
