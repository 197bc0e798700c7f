"""The router as the postprocessor sees it over gRPC: only ``Route``, for migrations."""

from __future__ import annotations

import grpc

from meshfront.router.v1 import router_pb2, router_pb2_grpc
from services.common import tls as mesh_tls
from services.common.error_interceptor import request_id_metadata
from services.common.errors import from_rpc_error
from services.common.grpc_server import CHANNEL_OPTIONS

# Several replicas ("ipv4:a:1,b:2") or a DNS name with many addresses: spread calls over all of them.
_LB_OPTIONS = [*CHANNEL_OPTIONS, ("grpc.lb_policy_name", "round_robin")]
# A migration is on the client's critical path: a router that does not answer soon is not waited for.
_ROUTE_TIMEOUT_S = 5.0


class GrpcRouterClient:
    def __init__(self, target: str, tls: mesh_tls.MeshTls | None = None):
        self._channel = mesh_tls.channel(target, _LB_OPTIONS, tls)
        self._stub = router_pb2_grpc.RouterServiceStub(self._channel)

    async def route(self, req: router_pb2.RouteRequest) -> router_pb2.RouteResponse:
        try:
            return await self._stub.Route(req, timeout=_ROUTE_TIMEOUT_S,
                                          metadata=request_id_metadata(req.request_id))
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from None

    async def close(self) -> None:
        await self._channel.close()
