"""A split request that migrates after its first token: the new attempt's prefill leg is freed at its own
first token (services/postprocessor/migration.py ``Migrator.report_first_token``), not at the release.

Real pieces: the router's service object (round-robin, the pair choice as in production), the postprocessor
with its worker client, two mockers (a prefill and a decode worker) and a scripted decode worker that fails
its leg, on loopback. No gateway: the first attempt's first-token report is the test's, as the gateway's is.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from meshfront.router.v1 import router_pb2

from services.common.discovery import DECODE, PREFILL, ModelCard, WorkerCard
from services.postprocessor.migration import Migrator
from services.postprocessor.service import Postprocessor
from services.router.disagg import prefill_leg_id
from services.router.service import Router
from tests.service.postprocessor.disagg_mockers import PROMPT, request
from tests.service.postprocessor.fake_worker import Fail

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]


async def until(check, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, "not within the time"
        await asyncio.sleep(0.005)


async def test_a_migrated_split_request_frees_its_new_prefill_leg_at_its_own_first_token(
        demo_model_dir, mockers, fake_worker):
    prefill, decode = await mockers("--speedup-ratio", "0"), await mockers("--speedup-ratio", "0.05")
    worker, fake_address = fake_worker
    model = ModelCard("demo", str(demo_model_dir), block_size=16)
    cards = [WorkerCard(prefill.id, prefill.address, model, role=PREFILL),
             WorkerCard("decode-fails", fake_address, model, role=DECODE),
             WorkerCard(decode.id, decode.address, model, role=DECODE)]
    router = Router(lambda name: cards)
    post = Postprocessor(idle_timeout_s=0, migrator=Migrator(router, 3))
    try:
        req = request(demo_model_dir, decode, prefill, tokens=200)
        rid = req.request.request_id
        # Round-robin: the first decode worker is the one whose leg fails.
        route = await router.route(router_pb2.RouteRequest(request_id=rid, model="demo", prompt_tokens=len(PROMPT)))
        assert (route.worker_id, route.prefill_worker_id, route.report_first_token) == ("decode-fails", prefill.id,
                                                                                       True)
        req.worker_id, req.worker_address = route.worker_id, route.address
        worker.script(rid, [Fail()])
        stream = post.generate(req)
        first = await stream.__anext__()  # the prefill leg's token: the gateway reports it
        assert first.prompt_tokens == len(PROMPT)
        await router.release_batch(router_pb2.ReleaseBatchRequest(
            first_tokens=[router_pb2.FirstTokenReport(request_id=rid, prompt_tokens=first.prompt_tokens)]))
        assert prefill_leg_id(rid) not in router.bookings and len(router.bookings) == 1
        # The decode leg fails; the router books the request again on a new pair, prefill leg included.
        moved = await stream.__anext__()
        assert moved.worker_id == decode.id and moved.prompt_tokens == 0  # no second report from the caller
        # The new attempt has its first token: its prefill leg is freed now, long before the request ends.
        await until(lambda: prefill_leg_id(rid) not in router.bookings, 2)
        assert len(router.bookings) == 1 and router.bookings.in_flight(prefill.id) == 0
        assert router.bookings.in_flight(decode.id) == 1  # the decode booking stands until the release
        await stream.aclose()
    finally:
        await post.close()
