"""gRPC glue for the router: proto in, Router, proto out (errors: services/common/error_interceptor.py)."""

from __future__ import annotations

import grpc
from meshfront.router.v1 import router_pb2, router_pb2_grpc
from prometheus_client import Histogram

from services.router.service import Router


class RouterServicer(router_pb2_grpc.RouterServiceServicer):
    def __init__(self, router: Router, route_duration: Histogram):
        self._router = router
        self._route_duration = route_duration  # the router's stage latency (the all-in-one shape has no such call)

    async def Route(self, request: router_pb2.RouteRequest, context: grpc.aio.ServicerContext):
        with self._route_duration.time():
            return await self._router.route(request)

    async def Release(self, request: router_pb2.ReleaseRequest, context: grpc.aio.ServicerContext):
        return await self._router.release(request)

    async def ReleaseBatch(self, request: router_pb2.ReleaseBatchRequest, context: grpc.aio.ServicerContext):
        return await self._router.release_batch(request)
