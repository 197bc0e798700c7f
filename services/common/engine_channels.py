"""Reaching stock engines by their cards: the gRPC stub class of each SMG engine-proto service a card's
``engine_protocol`` may name, their channels, and the live cards by address (kept apart from
services/common/engine_proto, which is pure message mapping and imports no grpc)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from smg_grpc_proto import sglang_scheduler_pb2_grpc, trtllm_service_pb2_grpc, vllm_engine_pb2_grpc

from services.common.cards import SGLANG_SCHEDULER, TRTLLM_SERVICE, VLLM_ENGINE, WorkerCard
from services.common.grpc_server import PINGED_CHANNEL_OPTIONS

STUBS: dict[str, Callable[[grpc.aio.Channel], Any]] = {
    VLLM_ENGINE: vllm_engine_pb2_grpc.VllmEngineStub, SGLANG_SCHEDULER: sglang_scheduler_pb2_grpc.SglangSchedulerStub,
    TRTLLM_SERVICE: trtllm_service_pb2_grpc.TrtllmServiceStub}


def engine_channel(address: str) -> grpc.aio.Channel:
    """A channel to a stock engine: cleartext (its own server holds none of the mesh's certificates), pinged so
    that a frozen engine is found out as a frozen worker is."""
    return grpc.aio.insecure_channel(address, options=PINGED_CHANNEL_OPTIONS)


class CardsByAddress:
    """The registry's live cards by address, kept by its change listener (``registry.subscribe(x.changed)``): a
    lookup per request, not a scan of every card."""

    def __init__(self) -> None:
        self._by_address: dict[str, WorkerCard] = {}
        self._address_of: dict[str, str] = {}

    def changed(self, worker_id: str, card: WorkerCard | None) -> None:
        old = self._address_of.pop(worker_id, None)
        if old is not None:
            self._by_address.pop(old, None)
        if card is not None:
            self._by_address[card.address] = card
            self._address_of[worker_id] = card.address

    def __call__(self, address: str) -> WorkerCard | None:
        return self._by_address.get(address)
