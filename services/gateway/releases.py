"""Releases ride on the next Route: two unary calls per request instead of three.

A request ends with a Release and, in kv mode, reports its first token (a FirstTokenReport). Each was
its own fire-and-forget call to the router. The router only needs them before it decides again, and
the next decision this gateway asks for is its next Route call, so ``RidingReleases`` holds them and
sends them inside that RouteRequest (``first_tokens``, then ``releases``, applied before routing).
When no Route follows within ``FLUSH_S`` (an idle gateway, or other replicas routing meanwhile) they
go in one ReleaseBatch. Over the mesh there is one per router replica (router_replicas.py): each holds
what goes back to the replica that booked those requests.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol, TypeVar

from meshfront.router.v1 import router_pb2

FLUSH_S = 0.02  # how late a release may reach the router when no Route carries it
_Carrier = TypeVar("_Carrier", router_pb2.RouteRequest, router_pb2.ReleaseBatchRequest)


class RouteCalls(Protocol):
    """The two calls that carry what is held: a Route, or a batch of its own."""

    async def route(self, req: router_pb2.RouteRequest) -> router_pb2.RouteResponse: ...

    async def release_batch(self, req: router_pb2.ReleaseBatchRequest) -> object: ...


class RidingReleases:
    """A ``RouterClient`` over ``RouteCalls`` that sends releases with the next route."""

    def __init__(self, router: RouteCalls, flush_s: float = FLUSH_S):
        self._router = router
        self._flush_s = flush_s
        self._pending: list[router_pb2.ReleaseRequest] = []
        self._first_tokens: list[router_pb2.FirstTokenReport] = []
        self._timer: asyncio.TimerHandle | None = None
        self._sending: set[asyncio.Task] = set()

    async def route(self, req: router_pb2.RouteRequest) -> router_pb2.RouteResponse:
        if self._pending or self._first_tokens:
            self._take(req)
        return await self._router.route(req)

    async def release(self, req: router_pb2.ReleaseRequest) -> None:
        self.hold_release(req)

    async def report_first_token(self, report: router_pb2.FirstTokenReport) -> None:
        self.hold_first_token(report)

    def hold_release(self, req: router_pb2.ReleaseRequest) -> None:
        self._pending.append(req)
        self._hold()

    def hold_first_token(self, report: router_pb2.FirstTokenReport) -> None:
        self._first_tokens.append(report)
        self._hold()

    def _hold(self) -> None:
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._flush_s, self._flush)

    async def release_batch(self, req: router_pb2.ReleaseBatchRequest) -> None:
        await self._router.release_batch(req)

    async def close(self) -> None:
        """Sends what is held (the gateway is stopping: nothing else will carry it)."""
        if self._pending or self._first_tokens:
            await self._router.release_batch(self._take(router_pb2.ReleaseBatchRequest()))
        for task in list(self._sending):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _take(self, carrier: _Carrier) -> _Carrier:
        """Moves what is held into ``carrier`` (both messages have the same two lists)."""
        carrier.first_tokens.extend(self._first_tokens)
        carrier.releases.extend(self._pending)
        self._first_tokens, self._pending = [], []
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        return carrier

    def _flush(self) -> None:
        self._timer = None
        if self._pending or self._first_tokens:
            task = asyncio.get_running_loop().create_task(
                self._router.release_batch(self._take(router_pb2.ReleaseBatchRequest())))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)
