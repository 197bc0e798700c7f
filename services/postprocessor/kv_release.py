"""Frees the KV blocks a prefill worker holds for a decode leg that will never come (``KvTransferService.
ReleaseKv`` with the prefill leg's ``kv_transfer_params``), so that a client's hang-up between the legs frees the
prefill worker at once instead of after its hold timeout.

Which worker of the pair serves the release is the prefill worker's card's ``kv_release_by``, fixed when it
registered (services/common/discovery.py): the prefill worker itself (the mocker's holds), or the decode worker
(vLLM, whose prefill engine's blocks only the decode side can free: services/workers/vllm/transfer.py). A prefill
worker whose card is not known here (it left, or no registry: tests) is asked itself.

Fire and forget: the request that asked is over; a worker that frees nothing on request (UNIMPLEMENTED) or is
gone simply times the hold out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

import grpc
from meshfront.worker.v1 import kv_transfer_pb2, kv_transfer_pb2_grpc

from services.common import tls as mesh_tls
from services.common.discovery import KV_RELEASE_BY_DECODE, KV_RELEASE_BY_PREFILL, WorkerCard
from services.common.grpc_server import CHANNEL_OPTIONS
from services.postprocessor.migration import WorkerRoute

log = logging.getLogger(__name__)

_RELEASE_TIMEOUT_S = 1.0


class GrpcKvReleaser:
    """One channel per worker address, opened on first use; ``cards`` are a model's workers (the registry's
    ``workers_for``), where the prefill worker's ``kv_release_by`` is read."""

    def __init__(self, tls: mesh_tls.MeshTls | None = None, cards: Callable[[str], Sequence[WorkerCard]] | None = None):
        self._tls = tls
        self._cards = cards
        self._stubs: dict[str, kv_transfer_pb2_grpc.KvTransferServiceStub] = {}
        self._channels: list[grpc.aio.Channel] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def release(self, route: WorkerRoute, model: str, kv_transfer_params: bytes) -> None:
        address = route.address if self.release_by(route, model) == KV_RELEASE_BY_DECODE else route.prefill_address
        task = asyncio.get_running_loop().create_task(self._release(address, kv_transfer_params))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def release_by(self, route: WorkerRoute, model: str) -> str:
        """The prefill worker's ``kv_release_by`` (once per release: only a request that ended between its legs)."""
        cards = self._cards(model) if self._cards is not None else ()
        card = next((c for c in cards if c.worker_id == route.prefill_worker_id), None)
        return card.kv_release_by if card is not None else KV_RELEASE_BY_PREFILL

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
