"""Migration decisions and continuation requests (pure: a recording router, no transport)."""

from __future__ import annotations

import asyncio

import pytest
from meshfront.common.v1 import common_pb2
from meshfront.router.v1 import router_pb2

from services.common.errors import InvalidRequest, NoWorkers, Overloaded, WorkerFailed
from services.postprocessor.migration import Migrator, WorkerRoute, continuation

pytestmark = pytest.mark.unit


def request(max_tokens: int | None = 10, min_tokens: int | None = None) -> common_pb2.PreprocessedRequest:
    req = common_pb2.PreprocessedRequest(request_id="r1", model="m", token_ids=[1, 2, 3])
    if max_tokens is not None:
        req.stop.max_tokens = max_tokens
    if min_tokens is not None:
        req.stop.min_tokens = min_tokens
    req.sampling.seed = 7
    return req


class RecordingRouter:
    """Answers Route with the next worker not excluded; records what it was asked."""

    def __init__(self, workers: list[str]):
        self.workers = workers
        self.calls: list[router_pb2.RouteRequest] = []

    async def route(self, req: router_pb2.RouteRequest) -> router_pb2.RouteResponse:
        self.calls.append(req)
        free = [w for w in self.workers if w not in req.exclude_worker_ids]
        if not free:
            raise NoWorkers("none left")
        return router_pb2.RouteResponse(worker_id=free[0], address=f"{free[0]}:1")


def test_continuation_extends_the_prompt_and_reduces_the_budgets():
    original = request(max_tokens=10, min_tokens=6)
    cont = continuation(original, [40, 41, 42, 43])
    assert list(cont.token_ids) == [1, 2, 3, 40, 41, 42, 43]
    assert cont.stop.max_tokens == 6 and cont.stop.min_tokens == 2
    assert cont.sampling.seed == 7 and cont.request_id == "r1"
    assert list(original.token_ids) == [1, 2, 3] and original.stop.max_tokens == 10  # untouched


def test_continuation_leaves_unset_budgets_unset_and_never_goes_below_bounds():
    cont = continuation(request(max_tokens=None), [5, 6])
    assert not cont.stop.HasField("max_tokens") and not cont.stop.HasField("min_tokens")
    assert continuation(request(max_tokens=3, min_tokens=1), [5, 6, 7]).stop.min_tokens == 0


def test_migrator_excludes_every_failed_worker_and_counts():
    router = RecordingRouter(["w1", "w2", "w3"])
    migrator = Migrator(router, limit=3)
    route = asyncio.run(migrator.next_route(request(), ["w1"], WorkerFailed("x"), 4))
    assert route == WorkerRoute("w2", "w2:1")
    route = asyncio.run(migrator.next_route(request(), ["w1", "w2"], WorkerFailed("x"), 9))
    assert route.worker_id == "w3"
    assert list(router.calls[-1].exclude_worker_ids) == ["w1", "w2"]
    assert router.calls[-1].request_id == "r1" and router.calls[-1].prompt_tokens == 12
    assert migrator.migrations == 2


@pytest.mark.parametrize("error", [InvalidRequest("bad"), NoWorkers("gone")])
def test_errors_about_the_request_are_not_migrated(error):
    router = RecordingRouter(["w1", "w2"])
    with pytest.raises(type(error)):
        asyncio.run(Migrator(router).next_route(request(), ["w1"], error, 0))
    assert not router.calls


def test_an_overloaded_worker_is_retried_elsewhere():
    route = asyncio.run(Migrator(RecordingRouter(["w1", "w2"])).next_route(request(), ["w1"], Overloaded("full"), 0))
    assert route.worker_id == "w2"


def test_limit_and_exhausted_fleet_raise_the_original_failure():
    failure = WorkerFailed("worker failed")
    with pytest.raises(WorkerFailed):
        migrator = Migrator(RecordingRouter(["w1", "w2", "w3"]), limit=1)
        asyncio.run(migrator.next_route(request(), ["w1", "w2"], failure, 0))
    with pytest.raises(WorkerFailed) as info:
        asyncio.run(Migrator(RecordingRouter(["w1"])).next_route(request(), ["w1"], failure, 0))
    assert info.value is failure
    with pytest.raises(WorkerFailed):
        asyncio.run(Migrator(None).next_route(request(), ["w1"], failure, 0))
