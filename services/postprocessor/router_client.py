"""The router as the postprocessor sees it over gRPC: ``Route`` for migrations, and ``ReleaseBatch`` for a
migrated attempt's first-token report (migration.py)."""

from __future__ import annotations

from meshfront.router.v1 import router_pb2, router_pb2_grpc

from services.common import tls as mesh_tls
from services.common.error_interceptor import request_id_metadata
from services.common.grpc_server import spread_options
from services.common.stage_wait import DEFAULT_WAIT_S, StageCaller

# Several replicas ("ipv4:a:1,b:2") or a DNS name with many addresses: calls spread over all of them
# (spread_options). Pinged: a frozen replica's connection is dropped in about 2 s.
# A migration is on the client's critical path: a router that does not answer soon is not waited for.
_ROUTE_TIMEOUT_S = 5.0


class GrpcRouterClient:
    """``Route`` waits up to ``wait_s`` (``--router-wait-s``) for a router that is restarting
    (services/common/stage_wait.py): a worker and the router dying together still migrate."""

    def __init__(self, target: str, tls: mesh_tls.MeshTls | None = None, wait_s: float = DEFAULT_WAIT_S):
        self._stage = StageCaller(mesh_tls.channel(target, spread_options(target), tls), "router", wait_s)
        self._stub = router_pb2_grpc.RouterServiceStub(self._stage.channel)

    async def route(self, req: router_pb2.RouteRequest) -> router_pb2.RouteResponse:
        metadata = request_id_metadata(req.request_id)
        return await self._stage.call(lambda: self._stub.Route(req, timeout=_ROUTE_TIMEOUT_S, metadata=metadata))

    async def release_batch(self, req: router_pb2.ReleaseBatchRequest) -> router_pb2.ReleaseBatchResponse:
        return await self._stage.call(lambda: self._stub.ReleaseBatch(req, timeout=_ROUTE_TIMEOUT_S))

    async def close(self) -> None:
        await self._stage.channel.close()
