"""The paired order of a disaggregated request (services/postprocessor/disagg_paired.py): both legs at once, for
a prefill worker that pairs by bootstrap as SGLang's does, on the real postprocessor and its mux client in front
of SGLang-like stand-in workers (tests/service/postprocessor/sglang_pair.py) on loopback gRPC servers.

In the sequential order an SGLang prefill leg waits for a decode leg that is never opened, until its bootstrap
timeout: every test here fails on a postprocessor that only knows that order.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import grpc
import orjson
import pytest
from meshfront.common.v1 import common_pb2
from meshfront.postprocessor.v1 import postprocessor_pb2
from meshfront.router.v1 import router_pb2
from meshfront.worker.v1 import worker_pb2_grpc

from services.common.error_interceptor import ErrorInterceptor
from services.postprocessor.migration import Migrator
from services.postprocessor.service import Postprocessor
from tests.service.postprocessor.disagg_mockers import collect
from tests.service.postprocessor.sglang_pair import PairWorker, Room, Timing

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]

PROMPT = [151644, 872, 198, *range(1000, 1040), 151645, 198, 151644, 77091, 198]
TOKENS = 12


@pytest.fixture
async def pair():
    """Starts SGLang-like workers sharing one bootstrap; each on its own server."""
    rooms: dict[int, Room] = {}
    servers = []

    async def start(timing: Timing | None = None) -> PairWorker:
        worker = PairWorker(rooms, timing)
        server = grpc.aio.server(interceptors=[ErrorInterceptor("worker")])
        worker_pb2_grpc.add_WorkerServiceServicer_to_server(worker, server)
        worker.address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        await server.start()
        servers.append(server)
        return worker

    yield start
    for server in servers:
        await server.stop(0)


class Router:
    """The router as a migration asks it: the given worker, aggregated."""

    def __init__(self, worker: PairWorker):
        self.worker = worker
        self.asked: list[router_pb2.RouteRequest] = []

    async def route(self, req):
        self.asked.append(req)
        return router_pb2.RouteResponse(worker_id="whole", address=self.worker.address)


def request(demo_model_dir, decode: PairWorker, prefill: PairWorker | None = None,
            tokens: int = TOKENS) -> postprocessor_pb2.GenerateRequest:
    req = postprocessor_pb2.GenerateRequest(worker_address=decode.address, worker_id="decode")
    if prefill is not None:
        req.prefill_worker_address, req.prefill_worker_id = prefill.address, "prefill"
    req.options.model_dir = str(demo_model_dir)
    req.request.request_id = uuid.uuid4().hex
    req.request.model = "demo"
    req.request.token_ids.extend(PROMPT)
    req.request.stop.max_tokens = tokens
    req.request.stop.ignore_eos = True
    return req


def ids(responses) -> list[int]:
    return [i for r in responses for i in r.token_ids]


async def migrated(demo_model_dir, whole: PairWorker,
                   req: postprocessor_pb2.GenerateRequest) -> tuple[list, list, router_pb2.RouteRequest]:
    """``req`` on a postprocessor whose migrations go to ``whole``: ``whole``'s own answer first (the one to
    equal), then the request's, and the one route its migration asked for."""
    router = Router(whole)
    post = Postprocessor(idle_timeout_s=0, migrator=Migrator(router, 3))
    try:
        want = await collect(post, request(demo_model_dir, whole))
        got = await collect(post, req)
    finally:
        await post.close()
    (asked,) = router.asked
    return want, got, asked


@pytest.mark.parametrize("first", ["prefill", "decode"])
@pytest.mark.parametrize("stream_interval", [1, 4])
async def test_both_legs_open_at_once_and_the_first_token_goes_out_once(demo_model_dir, pair, post, first,
                                                                         stream_interval):
    late = 0.15
    timing = Timing(prefill_token_after_kv_s=late if first == "decode" else 0.0,
                    decode_first_after_kv_s=late if first == "prefill" else 0.0)
    prefill, decode = await pair(timing), await pair(timing)
    want = await collect(post, request(demo_model_dir, decode))  # aggregated
    req = request(demo_model_dir, decode, prefill)
    req.options.stream_interval = stream_interval
    got = await collect(post, req)
    assert ids(got) == ids(want) and len(ids(got)) == TOKENS
    assert "".join(r.text for r in got) == "".join(r.text for r in want)
    assert sum(r.completion_tokens for r in got) == TOKENS and got[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert got[0].prompt_tokens == len(PROMPT)
    (named,) = [r for r in got if r.prefill_worker_id]
    assert (named.worker_id, named.prefill_worker_id) == ("decode", "prefill")
    assert (named.kv_transfer_ms >= late * 1000 * 0.9) if first == "prefill" else named.kv_transfer_ms == 0
    # The prefill leg asked for one token; the decode leg had the prefill leg's prompt, the request's budget and
    # the room the prefill worker announced.
    (p_leg,) = [r for r in prefill.received if r.request_id == req.request.request_id]
    (d_leg,) = [r for r in decode.received if r.request_id == req.request.request_id]
    assert p_leg.stop.max_tokens == 1 and p_leg.disaggregation.role == common_pb2.DISAGGREGATION_ROLE_PREFILL
    assert list(d_leg.token_ids) == PROMPT and d_leg.stop.max_tokens == TOKENS
    assert d_leg.disaggregation.role == common_pb2.DISAGGREGATION_ROLE_DECODE
    assert orjson.loads(d_leg.disaggregation.kv_transfer_params)["bootstrap_room"] in prefill.rooms


async def test_the_first_token_reaches_the_client_before_the_decode_leg_has_it(demo_model_dir, pair, post):
    prefill = await pair()
    decode = await pair(Timing(decode_first_after_kv_s=1.0))
    start = time.monotonic()
    stream = post.generate(request(demo_model_dir, decode, prefill))
    first = await stream.__anext__()
    assert first.completion_tokens == 1 and time.monotonic() - start < 0.6
    rest = [r async for r in stream]
    assert sum(r.completion_tokens for r in rest) == TOKENS - 1


async def test_a_one_token_request_ends_with_the_first_token_and_cancels_the_decode_leg(demo_model_dir, pair, post):
    prefill, decode = await pair(), await pair(Timing(decode_first_after_kv_s=5.0))
    req = request(demo_model_dir, decode, prefill, tokens=1)
    got = await collect(post, req)
    assert sum(r.completion_tokens for r in got) == 1 and got[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
    await asyncio.wait_for(decode.cancel_event(req.request.request_id).wait(), 0.2)


@pytest.mark.parametrize("phase", ["bootstrap", "decode"])
async def test_a_hang_up_cancels_both_legs_at_once(demo_model_dir, pair, post, phase):
    timing = Timing(prefill_s=5.0) if phase == "bootstrap" else Timing(step_s=0.05)
    prefill, decode = await pair(timing), await pair(timing)
    req = request(demo_model_dir, decode, prefill, tokens=400)
    stream = post.generate(req)
    if phase == "bootstrap":
        task = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0.3)
        assert not task.done() and req.request.request_id in [r.request_id for r in decode.received]
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    else:
        tokens = 0
        async for r in stream:
            tokens += r.completion_tokens
            if tokens >= 3:
                break
    start = time.monotonic()
    await stream.aclose()
    await asyncio.wait_for(decode.cancel_event(req.request.request_id).wait(), 0.2)
    if phase == "bootstrap":  # (in the decode phase the prefill leg had ended already)
        await asyncio.wait_for(prefill.cancel_event(req.request.request_id).wait(), 0.2)
    assert time.monotonic() - start < 0.2


async def test_a_failed_prefill_leg_cancels_the_decode_leg_and_the_request_runs_again(demo_model_dir, pair):
    prefill, decode, whole = await pair(), await pair(), await pair()
    prefill.fail_prefill = True
    req = request(demo_model_dir, decode, prefill)
    want, got, asked = await migrated(demo_model_dir, whole, req)
    assert ids(got) == ids(want)
    assert list(asked.exclude_worker_ids) == ["prefill"]
    assert decode.cancel_event(req.request.request_id).is_set()


async def test_a_failed_decode_leg_migrates_token_identical(demo_model_dir, pair):
    prefill, decode, whole = await pair(), await pair(), await pair()
    decode.fail_decode_after = 5
    want, got, asked = await migrated(demo_model_dir, whole, request(demo_model_dir, decode, prefill))
    assert ids(got) == ids(want) and len(ids(got)) == TOKENS
    assert list(asked.exclude_worker_ids) == ["decode"]


async def test_a_decode_leg_refused_for_its_room_blames_the_prefill_worker(demo_model_dir, pair):
    prefill, decode, whole = await pair(), await pair(), await pair()
    prefill.rooms = {}  # its rooms are not the decode worker's: the decode leg cannot connect
    want, got, asked = await migrated(demo_model_dir, whole, request(demo_model_dir, decode, prefill))
    assert ids(got) == ids(want)
    assert list(asked.exclude_worker_ids) == ["prefill"]
