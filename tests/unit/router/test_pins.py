"""A pin (nvext.backend_instance_id / x-worker-instance-id) to a worker that does not serve the model is the
client's mistake: a 400 naming the field, which never echoes control characters."""

from __future__ import annotations

import asyncio

import pytest
from meshfront.router.v1 import router_pb2

from services.common.discovery import ModelCard, WorkerCard
from services.common.errors import InvalidRequest, NoWorkers, Overloaded
from services.common.overload import BusyThreshold
from services.router.service import Router

pytestmark = pytest.mark.unit

CARDS = [WorkerCard(f"w{i}", f"127.0.0.1:{9000 + i}", ModelCard("m", "/tmp")) for i in range(2)]


def route(router: Router, rid: str, pin: str, exclude=()):
    return asyncio.run(router.route(router_pb2.RouteRequest(request_id=rid, model="m", prompt_tokens=4,
                                                            worker_id=pin, exclude_worker_ids=list(exclude))))


def test_a_pin_to_an_unknown_worker_is_a_400_naming_the_field():
    with pytest.raises(InvalidRequest) as e:
        route(Router(lambda model: CARDS), "r", "987654321")
    assert e.value.param == "nvext.backend_instance_id"
    assert "987654321" in e.value.message and "does not serve model `m`" in e.value.message


def test_a_pin_with_control_characters_is_echoed_escaped_and_cut():
    with pytest.raises(InvalidRequest) as e:
        route(Router(lambda model: CARDS), "r", "w\r\nX-Evil: 1\x00\x1b[31m" + "z" * 500)
    message = e.value.message
    assert not any(ord(c) < 0x20 or ord(c) == 0x7F for c in message)
    assert "\\r\\nX-Evil: 1\\x00\\x1b[31m" in message and "z" * 100 not in message


def test_a_busy_pinned_worker_is_not_the_clients_mistake():
    router = Router(lambda model: CARDS, busy=BusyThreshold(1))
    assert route(router, "r1", "w0").worker_id == "w0"
    with pytest.raises((NoWorkers, Overloaded)):
        route(router, "r2", "w0")


def test_a_pinned_worker_that_failed_and_left_during_migration_is_a_503():
    with pytest.raises(NoWorkers):
        route(Router(lambda model: CARDS), "r", "w7", exclude=["w7"])


def test_a_wrong_pin_is_a_400_at_once_even_while_requests_wait_for_the_model():
    """Before: the request joined the queue behind the waiting ones and, the workers staying busy, got a 503."""

    async def scenario():
        router = Router(lambda model: CARDS, busy=BusyThreshold(1), queue_timeout_s=5)
        for rid in ("a", "b"):
            await router.route(router_pb2.RouteRequest(request_id=rid, model="m", prompt_tokens=4))
        waiting = asyncio.create_task(router.route(router_pb2.RouteRequest(request_id="c", model="m",
                                                                           prompt_tokens=4)))
        await asyncio.sleep(0.05)
        assert router.queue.waiting("m") == 1
        with pytest.raises(InvalidRequest) as e:
            await asyncio.wait_for(router.route(router_pb2.RouteRequest(request_id="d", model="m", prompt_tokens=4,
                                                                        worker_id="987654321")), 1)
        assert e.value.param == "nvext.backend_instance_id"
        waiting.cancel()

    asyncio.run(scenario())
