"""The gateway's gRPC client of the workers' LoRA calls (services/gateway/lora_api.py decides which workers).

One channel per worker address, as the embedding client keeps. A worker's own refusal (a bad adapter
directory: INVALID_ARGUMENT; an adapter it does not hold: NOT_FOUND) keeps its meaning; a dead or
unreachable worker is ``WorkerFailed`` (503), its address in the log only.
"""

from __future__ import annotations

import grpc
from meshfront.common.v1 import common_pb2
from meshfront.worker.v1 import worker_pb2, worker_pb2_grpc

from services.common import tls as mesh_tls
from services.common.discovery import LoraAdapter
from services.common.grpc_server import PINGED_CHANNEL_OPTIONS
from services.gateway.core.worker_errors import worker_error

# A load reads the adapter's weights (a few seconds for a large one on a busy machine).
CALL_TIMEOUT_S = 120.0


class GrpcLoraWorkers:
    def __init__(self, tls: mesh_tls.MeshTls | None = None) -> None:
        self._tls = tls
        self._stubs: dict[str, worker_pb2_grpc.WorkerServiceStub] = {}
        self._channels: list[grpc.aio.Channel] = []

    def _stub(self, address: str) -> worker_pb2_grpc.WorkerServiceStub:
        stub = self._stubs.get(address)
        if stub is None:
            channel = mesh_tls.channel(address, PINGED_CHANNEL_OPTIONS, self._tls)
            self._channels.append(channel)
            stub = self._stubs[address] = worker_pb2_grpc.WorkerServiceStub(channel)
        return stub

    async def load(self, address: str, adapter: LoraAdapter) -> bool:
        req = worker_pb2.LoadLoraAdapterRequest(adapter=common_pb2.LoraAdapter(name=adapter.name, path=adapter.path))
        try:
            return (await self._stub(address).LoadLoraAdapter(req, timeout=CALL_TIMEOUT_S)).loaded
        except grpc.aio.AioRpcError as e:
            raise worker_error(e, address, "LoRA") from None

    async def unload(self, address: str, name: str) -> None:
        try:
            await self._stub(address).UnloadLoraAdapter(worker_pb2.UnloadLoraAdapterRequest(name=name),
                                                        timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as e:
            raise worker_error(e, address, "LoRA") from None

    async def close(self) -> None:
        channels, self._channels, self._stubs = self._channels, [], {}
        for channel in channels:
            await channel.close()
