"""gRPC glue of the mocker's KV transfer (transfer.py): ``KvTransferService`` on the worker's own port, and the
decode worker's client of it.

The pull is a unary call from the decode mocker to the prefill mocker the transfer parameters name; the
handle is freed there as the answer leaves. The caller's ``ReleaseKv`` (the postprocessor, for a decode leg
that will never come) reaches the same service.
"""

from __future__ import annotations

import grpc
from meshfront.worker.v1 import kv_transfer_pb2, kv_transfer_pb2_grpc

from services.common import tls as mesh_tls
from services.common.errors import NotFound
from services.common.grpc_server import CHANNEL_OPTIONS
from services.workers.engine import KvTransferFailed
from services.workers.mocker.transfer import ComputedKv, KvHolds, PulledKv, RemotePrefill

# A pull is on the decode leg's critical path: a prefill worker that does not answer soon is given up on,
# and the request runs its prefill again elsewhere.
PULL_TIMEOUT_S = 2.0
# A pipelined pull is answered when the prefill finishes, which may queue behind others first; a prefill worker
# that dies meanwhile ends the call at once (its connection goes), so this only bounds one that hangs.
PIPELINED_PULL_TIMEOUT_S = 120.0


class KvTransferServicer(kv_transfer_pb2_grpc.KvTransferServiceServicer):
    def __init__(self, holds: KvHolds):
        self._holds = holds

    async def PullKv(self, request: kv_transfer_pb2.PullKvRequest,
                     context: grpc.aio.ServicerContext) -> kv_transfer_pb2.PullKvResponse:
        try:
            pulled = await self._holds.take(request.worker_id, request.handle)
        except KeyError:
            raise NotFound("no KV blocks are held under this handle (expired, released or pulled already)",
                           param="kv_transfer_params") from None
        return kv_transfer_pb2.PullKvResponse(
            num_tokens=pulled.num_tokens, block_hashes=pulled.block_hashes, waited_s=pulled.waited_s,
            computed=[kv_transfer_pb2.ComputedKv(start_s=c.start_s, duration_s=c.duration_s, tokens=c.tokens)
                      for c in pulled.computed])

    async def ReleaseKv(self, request: kv_transfer_pb2.ReleaseKvRequest,
                        context: grpc.aio.ServicerContext) -> kv_transfer_pb2.ReleaseKvResponse:
        return kv_transfer_pb2.ReleaseKvResponse(released=self._holds.release_params(request.kv_transfer_params))


def add_kv_transfer(server: grpc.aio.Server, holds: KvHolds) -> None:
    kv_transfer_pb2_grpc.add_KvTransferServiceServicer_to_server(KvTransferServicer(holds), server)


class GrpcKvPuller:
    """Pulls held blocks from prefill workers, one channel per address."""

    def __init__(self, tls: mesh_tls.MeshTls | None = None):
        self._tls = tls
        self._stubs: dict[str, kv_transfer_pb2_grpc.KvTransferServiceStub] = {}
        self._channels: list[grpc.aio.Channel] = []

    async def pull(self, source: RemotePrefill) -> PulledKv:
        stub = self._stubs.get(source.address)
        if stub is None:
            channel = mesh_tls.channel(source.address, CHANNEL_OPTIONS, self._tls)
            self._channels.append(channel)
            stub = self._stubs[source.address] = kv_transfer_pb2_grpc.KvTransferServiceStub(channel)
        try:
            reply = await stub.PullKv(kv_transfer_pb2.PullKvRequest(worker_id=source.worker_id, handle=source.handle),
                                      timeout=PIPELINED_PULL_TIMEOUT_S if source.pipelined else PULL_TIMEOUT_S)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                raise KvTransferFailed(f"prefill worker {source.worker_id} holds no such KV blocks "
                                       "(expired, released or pulled already)") from None
            raise KvTransferFailed(f"prefill worker {source.worker_id} cannot be reached ({e.code().name})") from None
        return PulledKv(reply.num_tokens, tuple(reply.block_hashes), reply.waited_s,
                        tuple(ComputedKv(c.start_s, c.duration_s, c.tokens) for c in reply.computed))

    async def close(self) -> None:
        channels, self._channels, self._stubs = self._channels, [], {}
        for channel in channels:
            await channel.close()
