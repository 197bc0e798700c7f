"""A routed request's hold on its worker: booked by the router's Route, given back by a Release.

The router books every request it routes against the chosen worker until the gateway releases it, so
a request that is never released holds its worker's capacity for good. Every pipeline (generation in
core/pipeline.py, embeddings, media) routes through ``RouteLeases.route`` and releases through the
lease it gets, however the request ends (answered, failed, the client gone): ``async with lease``, or
``lease.release()`` where the request outlives one block.

What the lease tells the router (the release, the first token) is fire and forget: a reply never waits
on the router's bookkeeping. Over the mesh both ride on the next Route call (releases.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from types import TracebackType
from typing import Any

from meshfront.router.v1 import router_pb2

from services.gateway.clients import RouterClient


class RouteLeases:
    """Routes requests and keeps the router's notices in flight until they are sent."""

    def __init__(self, router: RouterClient):
        self.router = router
        self._in_flight: set[asyncio.Task] = set()

    async def route(self, req: router_pb2.RouteRequest) -> RouteLease:
        """Routes ``req``; the lease must be released (a failed Route booked nothing and leases nothing)."""
        return RouteLease(self, req.request_id, await self.router.route(req))

    def notify(self, call: Coroutine[Any, Any, None]) -> None:
        """Sends a notice to the router without waiting for it (the task is kept until it ends)."""
        task = asyncio.create_task(call)
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)


class RouteLease:
    """One routed request: ``route`` is the router's answer (the worker, what it wants to hear)."""

    def __init__(self, leases: RouteLeases, request_id: str, route: router_pb2.RouteResponse):
        self.request_id = request_id
        self.route = route
        self._leases = leases
        self._released = False

    def report_first_token(self, cached_tokens: int, prompt_tokens: int) -> None:
        """Tells the router that prefill is done and what the worker had cached (its accuracy metrics),
        when the route asked to know; a router that predates FirstTokenReport hears it in a Release."""
        if not self.route.report_first_token:
            return
        router = self._leases.router
        if self.route.reads_first_token_reports:
            self._leases.notify(router.report_first_token(router_pb2.FirstTokenReport(
                request_id=self.request_id, cached_tokens=cached_tokens, prompt_tokens=prompt_tokens)))
        else:
            self._leases.notify(router.release(router_pb2.ReleaseRequest(
                request_id=self.request_id, first_token=True, cached_tokens=cached_tokens,
                prompt_tokens=prompt_tokens)))

    def release(self) -> None:
        """Gives the worker's booking back (once, however often it is called)."""
        if not self._released:
            self._released = True
            self._leases.notify(self._leases.router.release(router_pb2.ReleaseRequest(request_id=self.request_id)))

    async def __aenter__(self) -> RouteLease:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, err: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.release()
