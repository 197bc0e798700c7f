"""The gateway's client of embedding workers: one channel per worker address, shared by all requests.

Embeddings skip the postprocessor (nothing to detokenize or parse), so the gateway itself calls the
worker the router chose. Failures keep their meaning: a worker's 400 stays a 400; a dead, frozen or
unreachable worker (or one that is not an embedding worker after all) is ``WorkerFailed``, which the
pipeline retries once on another worker and otherwise answers 503.

A worker whose card names an ``engine_protocol`` is a stock engine over SMG's engine proto
(docs/engine-grpc.md): its ``Embed`` takes one sequence a call, so the inputs go as concurrent calls and
their vectors come back as our worker's little-endian float32 rows.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import Any, Protocol

import grpc
from meshfront.worker.v1 import worker_pb2, worker_pb2_grpc

from services.common import engine_proto
from services.common import tls as mesh_tls
from services.common.cards import WorkerCard
from services.common.engine_channels import STUBS, engine_channel
from services.common.errors import InvalidRequest
from services.common.grpc_server import PINGED_CHANNEL_OPTIONS
from services.gateway.core.worker_errors import worker_error


class EmbedWorkerClient(Protocol):
    async def embed(self, address: str, req: worker_pb2.EmbedRequest) -> worker_pb2.EmbedResponse: ...


class GrpcEmbedWorker:
    """``card_at``: the live card at an address (services/common/engine_channels.CardsByAddress); None: every
    address is our own worker."""

    def __init__(self, tls: mesh_tls.MeshTls | None = None,
                 card_at: Callable[[str], WorkerCard | None] | None = None) -> None:
        self._tls = tls
        self._card_at = card_at
        self._stubs: dict[str, worker_pb2_grpc.WorkerServiceStub] = {}
        self._engine_stubs: dict[str, Any] = {}
        self._channels: list[grpc.aio.Channel] = []

    async def embed(self, address: str, req: worker_pb2.EmbedRequest) -> worker_pb2.EmbedResponse:
        card = self._card_at(address) if self._card_at is not None else None
        if card is not None and card.engine_protocol:
            return await self._engine_embed(card, req)
        stub = self._stubs.get(address)
        if stub is None:
            channel = mesh_tls.channel(address, PINGED_CHANNEL_OPTIONS, self._tls)  # a frozen worker fails in ~2 s
            self._channels.append(channel)
            stub = self._stubs[address] = worker_pb2_grpc.WorkerServiceStub(channel)
        try:
            return await stub.Embed(req)
        except grpc.aio.AioRpcError as e:
            raise worker_error(e, address, "embedding") from None

    async def _engine_embed(self, card: WorkerCard, req: worker_pb2.EmbedRequest) -> worker_pb2.EmbedResponse:
        if req.HasField("dimensions"):
            raise InvalidRequest("dimensions is not carried over an engine's own gRPC (SMG's engine proto); "
                                 "leave it out for the model's own size", param="dimensions")
        stub = self._engine_stubs.get(card.address)
        if stub is None:
            channel = engine_channel(card.address)
            self._channels.append(channel)
            stub = self._engine_stubs[card.address] = STUBS[card.engine_protocol](channel)
        calls = [stub.Embed(engine_proto.embed_request(card.engine_protocol, f"{req.request_id}-{i}",
                                                       list(x.token_ids)))
                 for i, x in enumerate(req.inputs)]
        try:
            replies = await asyncio.gather(*calls)
        except grpc.aio.AioRpcError as e:
            for call in calls:
                call.cancel()
            raise worker_error(e, card.address, "embedding") from None
        vectors = [engine_proto.embedding(r) for r in replies]
        return worker_pb2.EmbedResponse(embeddings=[struct.pack(f"<{len(v)}f", *v) for v in vectors],
                                        dimensions=len(vectors[0]) if vectors else 0,
                                        prompt_tokens=sum(r.prompt_tokens for r in replies))

    async def close(self) -> None:
        channels, self._channels, self._stubs, self._engine_stubs = self._channels, [], {}, {}
        for channel in channels:
            await channel.close()
