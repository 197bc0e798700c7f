"""gRPC glue for the router: proto in, Router, proto out; errors through one mapping."""

from __future__ import annotations

import grpc

from meshfront.router.v1 import router_pb2, router_pb2_grpc
from services.common.errors import MeshError, abort
from services.router.service import Router


class RouterServicer(router_pb2_grpc.RouterServiceServicer):
    def __init__(self, router: Router):
        self._router = router

    async def Route(self, request: router_pb2.RouteRequest, context: grpc.aio.ServicerContext):
        try:
            return await self._router.route(request)
        except MeshError as e:
            await abort(context, e)

    async def Release(self, request: router_pb2.ReleaseRequest, context: grpc.aio.ServicerContext):
        return await self._router.release(request)
