"""A disaggregated request's two legs (services/postprocessor/disagg_legs.py) on two real mockers.

Real pieces on loopback: a prefill mocker and a decode mocker as their processes build them (the worker
server with its KvTransferService, the decode side's gRPC puller), and the real postprocessor with its
multiplexed worker client and KV releaser (the fixtures in conftest.py, the helpers in disagg_mockers.py).
The route is given as the router would give it (the prefill worker next to the decode worker): the router's
choice is tested with the router. The mocker is deterministic (pseudo-random mode), so a disaggregated answer
must equal the aggregated one token for token.
"""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest
from meshfront.common.v1 import common_pb2
from meshfront.router.v1 import router_pb2

from services.postprocessor.migration import Migrator
from services.postprocessor.service import Postprocessor
from services.workers.mocker.sequence import full_blocks
from services.workers.mocker.transfer import transfer_metrics
from tests.service.postprocessor.disagg_mockers import (
    PROMPT,
    TOKENS,
    Mocker,
    collect,
    hang_up_during_the_prefill,
    pulled,
    received,
    request,
    wait_idle,
)
from tests.service.postprocessor.fake_worker import Forever

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]

# 13 blocks of 64 MB at 1 GB/s: a transfer of ~0.8 s.
SLOW_TRANSFER = ("--kv-block-bytes", str(64 * 10**6), "--kv-transfer-bandwidth-gbs", "1")

async def test_two_legs_answer_as_one_worker_does_and_the_decode_worker_has_the_prompt_cached(
        demo_model_dir, mockers, post):
    prefill, decode = await mockers("--speedup-ratio", "0"), await mockers("--speedup-ratio", "0")
    want = await collect(post, request(demo_model_dir, prefill))  # aggregated, on either one
    before = pulled()
    got = await collect(post, request(demo_model_dir, decode, prefill))
    assert "".join(r.text for r in got) == "".join(r.text for r in want)
    assert [i for r in got for i in r.token_ids] == [i for r in want for i in r.token_ids]
    assert sum(r.completion_tokens for r in got) == TOKENS and got[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
    # The first response is the prefill leg's one token, with the usage; the decode leg's first names both workers.
    assert got[0].completion_tokens == 1 and got[0].prompt_tokens == len(PROMPT)
    assert (got[1].worker_id, got[1].prefill_worker_id) == (decode.id, prefill.id) and got[1].kv_transfer_ms > 0
    # The blocks moved by one pull; the decode worker holds the prompt's blocks, the prefill worker holds nothing.
    assert pulled() == before + 1
    assert all(decode.engine.cache.contains(b.block_hash) for b in full_blocks(PROMPT, 16))
    await wait_idle(prefill, decode)


async def test_a_one_token_request_ends_with_its_prefill_leg_and_frees_the_held_blocks(demo_model_dir, mockers, post):
    prefill, decode = await mockers("--speedup-ratio", "0"), await mockers("--speedup-ratio", "0")
    got = await collect(post, request(demo_model_dir, decode, prefill, tokens=1))
    assert sum(r.completion_tokens for r in got) == 1 and got[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
    await wait_idle(prefill, decode)  # released at once, not after the hold timeout
    assert decode.engine.steps == 0


async def test_cancel_during_the_prefill_frees_the_prefill_worker(demo_model_dir, mockers, post):
    prefill = await mockers("--speedup-ratio", "0.02")  # a prefill of seconds
    decode = await mockers("--speedup-ratio", "0")
    await hang_up_during_the_prefill(post, request(demo_model_dir, decode, prefill), prefill)
    await wait_idle(prefill, decode)


async def test_cancel_during_the_transfer_frees_both_workers(demo_model_dir, mockers, post):
    prefill = await mockers("--speedup-ratio", "1")
    decode = await mockers("--speedup-ratio", "1", *SLOW_TRANSFER)
    stream = post.generate(request(demo_model_dir, decode, prefill))
    first = await stream.__anext__()
    assert first.completion_tokens == 1
    await asyncio.sleep(0.1)
    await stream.aclose()
    await wait_idle(prefill, decode)


async def test_a_hang_up_before_the_pull_releases_the_held_blocks(demo_model_dir, mockers, post, fake_worker):
    """The decode worker (a scripted one that never pulls) got its leg; the client leaves: the prefill worker's
    hold is released by the postprocessor at once, not after its 30 s timeout."""
    prefill = await mockers("--speedup-ratio", "0")
    worker, address = fake_worker
    req = request(demo_model_dir, prefill, prefill)
    req.worker_address, req.worker_id = address, "decode-fake"
    cancelled = worker.script(req.request.request_id, [Forever()])
    released = transfer_metrics()[0].labels("released")._value.get()
    stream = post.generate(req)
    assert (await stream.__anext__()).completion_tokens == 1
    await asyncio.wait_for(asyncio.shield(received(worker, req.request.request_id)), 5)
    assert prefill.engine.holds.held_blocks == 14  # 13 full blocks and the tail, for the decode worker
    await stream.aclose()
    await wait_idle(prefill)
    assert transfer_metrics()[0].labels("released")._value.get() == released + 1
    await asyncio.wait_for(cancelled.wait(), 1)  # and the decode leg was cancelled
    (leg,) = [r.request for r in worker.received if r.request.request_id == req.request.request_id]
    assert leg.disaggregation.role == common_pb2.DISAGGREGATION_ROLE_DECODE
    assert orjson.loads(leg.disaggregation.kv_transfer_params)["remote_engine_id"] == prefill.id
    assert list(leg.token_ids)[:-1] == PROMPT and leg.stop.max_tokens == TOKENS - 1


async def test_cancel_during_the_decode_frees_both_workers(demo_model_dir, mockers, post):
    prefill, decode = await mockers("--speedup-ratio", "1"), await mockers("--speedup-ratio", "1")
    stream = post.generate(request(demo_model_dir, decode, prefill, tokens=400))
    tokens = 0
    async for r in stream:
        tokens += r.completion_tokens
        if tokens >= 5:
            break
    await stream.aclose()
    await wait_idle(prefill, decode)


class RecordingRouter:
    """The router as a migration asks it: another route, here the decode worker alone (aggregated)."""

    def __init__(self, decode: Mocker):
        self.decode = decode
        self.asked: list = []

    async def route(self, req):
        self.asked.append(req)
        return router_pb2.RouteResponse(worker_id=self.decode.id, address=self.decode.address)


async def test_a_refused_transfer_blames_the_prefill_worker_and_the_request_runs_again(demo_model_dir, mockers):
    prefill = await mockers("--speedup-ratio", "0", "--kv-hold-timeout-s", "0.000001")  # expires at once
    decode = await mockers("--speedup-ratio", "0")
    router = RecordingRouter(decode)
    post = Postprocessor(idle_timeout_s=0, migrator=Migrator(router, 3))
    try:
        want = await collect(post, request(demo_model_dir, decode))
        got = await collect(post, request(demo_model_dir, decode, prefill))
    finally:
        await post.close()
    assert [i for r in got for i in r.token_ids] == [i for r in want for i in r.token_ids]
    # The decode worker refused the expired handle; the migration excluded the prefill worker, not the decode one.
    (asked,) = router.asked
    assert list(asked.exclude_worker_ids) == [prefill.id]
    assert transfer_metrics()[0].labels("refused")._value.get() >= 1
    await wait_idle(prefill, decode)


async def test_a_guided_request_runs_whole_on_its_decode_worker(demo_model_dir, mockers, post):
    """A grammar's state cannot pass from the prefill worker to the decode worker (as it cannot migrate)."""
    prefill, decode = await mockers("--speedup-ratio", "0"), await mockers("--speedup-ratio", "0")
    req = request(demo_model_dir, decode, prefill, tokens=200)
    req.request.sampling.guided_decoding.json_object = True
    req.request.stop.ignore_eos = False
    req.request.eos_token_ids.append(151645)
    req.request.stop.stop_token_ids_hidden.append(151645)
    got = await collect(post, req)
    assert isinstance(orjson.loads("".join(r.text for r in got)), dict), "".join(r.text for r in got)
    assert prefill.engine.steps == 0 and decode.engine.steps > 0


async def test_the_first_token_does_not_wait_for_the_transfer(demo_model_dir, mockers, post):
    prefill = await mockers("--speedup-ratio", "1")
    decode = await mockers("--speedup-ratio", "1", *SLOW_TRANSFER)
    start = time.monotonic()
    stream = post.generate(request(demo_model_dir, decode, prefill, tokens=3))
    first = await stream.__anext__()
    ttft = time.monotonic() - start
    second = await stream.__anext__()
    await stream.aclose()
    assert first.completion_tokens == 1 and ttft < 0.5  # a ~45 ms prefill, and the hops
    assert second.kv_transfer_ms >= 800  # the transfer came after it
