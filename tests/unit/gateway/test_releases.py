"""Releases ride on the next Route (services/gateway/releases.py): two unary calls per request."""

from __future__ import annotations

import asyncio

import pytest
from meshfront.router.v1 import router_pb2

from services.gateway.releases import RidingReleases

pytestmark = pytest.mark.unit


class Router:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []
        self.first_tokens: list[list[str]] = []  # of each call, beside its releases

    async def route(self, req):
        self.calls.append(("route", [r.request_id for r in req.releases]))
        self.first_tokens.append([r.request_id for r in req.first_tokens])
        return router_pb2.RouteResponse(worker_id="w")

    async def release(self, req):
        raise AssertionError("releases never go one call each")

    async def release_batch(self, req):
        self.calls.append(("batch", [r.request_id for r in req.releases]))
        self.first_tokens.append([r.request_id for r in req.first_tokens])


async def test_releases_ride_on_the_next_route_and_are_sent_once():
    router = Router()
    riding = RidingReleases(router, flush_s=10)
    await riding.report_first_token(router_pb2.FirstTokenReport(request_id="a"))
    await riding.release(router_pb2.ReleaseRequest(request_id="a"))
    await riding.route(router_pb2.RouteRequest(request_id="b"))
    await riding.route(router_pb2.RouteRequest(request_id="c"))
    assert router.calls == [("route", ["a"]), ("route", [])]
    assert router.first_tokens == [["a"], []]


async def test_without_a_route_they_go_in_one_batch_soon():
    router = Router()
    riding = RidingReleases(router, flush_s=0.01)
    await riding.report_first_token(router_pb2.FirstTokenReport(request_id="z"))
    for rid in ("a", "b", "c"):
        await riding.release(router_pb2.ReleaseRequest(request_id=rid))
    await asyncio.sleep(0.1)
    assert router.calls == [("batch", ["a", "b", "c"])] and router.first_tokens == [["z"]]
    await riding.route(router_pb2.RouteRequest(request_id="d"))
    assert router.calls[-1] == ("route", [])


async def test_closing_sends_what_is_held():
    router = Router()
    riding = RidingReleases(router, flush_s=10)
    await riding.report_first_token(router_pb2.FirstTokenReport(request_id="z"))
    await riding.close()
    assert router.calls == [("batch", [])] and router.first_tokens == [["z"]]  # a report alone is sent too
