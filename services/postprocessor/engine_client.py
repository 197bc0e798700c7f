"""Generate calls on stock engines over their own gRPC (SMG's engine proto), behind the postprocessor's
``WorkerClient``: a card whose ``engine_protocol`` is set is called here, every other through our own
worker's ``GenerateStream`` (mux_client.py), with the same semantics for the request's reader.

- One server-streaming Generate per sequence (the engine proto has no multiplexed stream); its messages
  become our worker's ``GenerateResponse``s (services/common/engine_proto).
- Cancel cancels the call and sends the engine ``Abort`` for the sequence at once: the engine frees it
  whether or not its servicer watches for a cancelled call.
- A failed or broken call is ``WorkerFailed`` as with our workers (mux_client.worker_error), so the request
  migrates; what the engine's proto cannot carry is refused before the call (``InvalidRequest``, a 400).
- Engines are reached in cleartext: an engine's own server does not hold the mesh's certificates.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from typing import Any

import grpc
from meshfront.worker.v1 import worker_pb2

from services.common import engine_proto
from services.common.cards import WorkerCard
from services.common.engine_channels import STUBS, engine_channel
from services.common.errors import InvalidRequest, MeshError, WorkerFailed
from services.common.pump import Batch, take_batch
from services.postprocessor.attempt import WorkerCall, WorkerClient
from services.postprocessor.mux_client import WORKER_FAILED, worker_error

log = logging.getLogger(__name__)

_END = object()
ABORT_TIMEOUT_S = 2.0


class EngineCall:
    """One sequence's Generate call on an engine (a ``WorkerCall``)."""

    def __init__(self, client: EngineWorkerClient, card: WorkerCard, stub: Any, request: Any,
                 eos_token_ids: list[int]):
        self._client = client
        self._card = card
        self._request_id: str = request.request_id
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._stream = engine_proto.EngineStream(eos_token_ids)
        self._done = False  # the engine holds nothing for it any more: finished, failed or aborted
        self._call = stub.Generate(request)
        self._task = asyncio.create_task(self._read(), name=f"engine-{self._request_id}")

    async def _read(self) -> None:
        try:
            async for message in self._call:  # queued as they come; read in batches by next_batch
                self._queue.put_nowait(message)
                if message.WhichOneof("response") == "complete":
                    self._done = True
            self._queue.put_nowait(_END)
        except grpc.aio.AioRpcError as e:
            self._queue.put_nowait(worker_error(e, self._card.address))
        finally:
            self._done = self._done or self._call.done()

    async def next_batch(self) -> Batch[worker_pb2.GenerateResponse]:
        batch: Batch[Any] = await take_batch(self._queue, _END)
        if batch.messages:
            try:
                batch.messages = [self._stream.read(batch.messages)]
            except ValueError as e:  # a response we cannot read: the engine is not what its card says
                log.warning("engine %s sent an unreadable response: %s", self._card.address, e)
                return Batch([], error=WorkerFailed(WORKER_FAILED))
        return batch

    def cancel(self) -> None:
        if not self._done:
            self._done = True
            self._client.abort(self._card, self._request_id)
        self._call.cancel()

    def fail(self, error: MeshError) -> None:
        self._queue.put_nowait(error)


class RefusedCall:
    """A call that was never made: the engine's proto cannot carry the request."""

    def __init__(self, error: MeshError):
        self._error = error

    async def next_batch(self) -> Batch[worker_pb2.GenerateResponse]:
        return Batch([], error=self._error)

    def cancel(self) -> None:
        pass

    def fail(self, error: MeshError) -> None:
        self._error = error


class EngineWorkerClient:
    """Opens Generate calls on engines over SMG's engine proto, one cleartext channel per address."""

    def __init__(self) -> None:
        self._stubs: dict[str, Any] = {}
        self._channels: list[grpc.aio.Channel] = []
        self._ids = itertools.count()
        self._aborts: set[asyncio.Task] = set()

    def generate(self, card: WorkerCard, request: worker_pb2.GenerateRequest) -> WorkerCall:
        req = request.request
        refused = engine_proto.refusal(card.engine_protocol, req)
        if refused is not None:
            return RefusedCall(InvalidRequest(str(refused), param=refused.param))
        # The engine's id: unique per call, so a retry on the same engine never meets its own aborted sequence.
        engine_id = f"{req.request_id}-{next(self._ids)}"
        message = engine_proto.generate_request(card.engine_protocol, req, engine_id, card.model.context_length,
                                                card.sampling_defaults)
        return EngineCall(self, card, self._stub(card), message, list(req.eos_token_ids))

    def _stub(self, card: WorkerCard) -> Any:
        key = f"{card.engine_protocol}@{card.address}"
        stub = self._stubs.get(key)
        if stub is None:
            channel = engine_channel(card.address)
            self._channels.append(channel)
            stub = self._stubs[key] = STUBS[card.engine_protocol](channel)
        return stub

    def abort(self, card: WorkerCard, request_id: str) -> None:
        """Sends Abort for ``request_id`` now, without waiting for the answer (a failure is logged)."""
        task = asyncio.create_task(self._abort(card, request_id))
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)

    async def _abort(self, card: WorkerCard, request_id: str) -> None:
        try:
            abort = engine_proto.abort_request(card.engine_protocol, request_id)
            await self._stub(card).Abort(abort, timeout=ABORT_TIMEOUT_S)
        except grpc.aio.AioRpcError as e:
            log.warning("engine %s: abort of %s failed: %s", card.address, request_id, e.code().name)

    async def close(self) -> None:
        if self._aborts:
            await asyncio.wait(self._aborts, timeout=ABORT_TIMEOUT_S)
        channels, self._channels, self._stubs = self._channels, [], {}
        for channel in channels:
            await channel.close()


class ByProtocolWorkerClient:
    """The postprocessor's ``WorkerClient``: each address to the client its card's ``engine_protocol`` names."""

    def __init__(self, own: WorkerClient, engines: EngineWorkerClient, card_at: Callable[[str], WorkerCard | None]):
        self._own = own
        self._engines = engines
        self._card_at = card_at

    def generate(self, address: str, request: worker_pb2.GenerateRequest) -> WorkerCall:
        card = self._card_at(address)
        if card is None or not card.engine_protocol:
            req = request.request
            peer = self._card_at(req.disaggregation.peer_address) if req.HasField("disaggregation") else None
            if peer is not None and peer.engine_protocol:
                # The prefill leg, on our worker, of a pair whose decode worker is an engine: refused here, before
                # our worker holds blocks for a decode leg the engine's proto cannot take.
                refused = engine_proto.refusal(peer.engine_protocol, req)
                assert refused is not None  # a disaggregated leg always is
                return RefusedCall(InvalidRequest(str(refused), param=refused.param))
            return self._own.generate(address, request)
        return self._engines.generate(card, request)

