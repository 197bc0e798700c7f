"""A multiplexed GenerateStream with no open call half-closes (services/common/mux_client.py, IDLE_CLOSE_S), so an
idle mesh keeps no call open and its channels send no keepalive pings; the next request opens a fresh one."""

from __future__ import annotations

import asyncio

import pytest
from meshfront.common.v1 import common_pb2
from meshfront.worker.v1 import worker_pb2

from services.common import mux_client
from services.postprocessor.mux_client import MuxWorkerClient

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]


def request(rid: str) -> worker_pb2.GenerateRequest:
    return worker_pb2.GenerateRequest(request=common_pb2.PreprocessedRequest(
        request_id=rid, model="demo", token_ids=list(range(40)), eos_token_ids=[151645],
        stop=common_pb2.StopConditions(ignore_eos=True, max_tokens=8)))


async def tokens(call) -> list[int]:
    out: list[int] = []
    while True:
        batch = await asyncio.wait_for(call.next_batch(), 10)
        assert batch.error is None
        out.extend(t for m in batch.messages for t in m.token_ids)
        if batch.ended:
            return out


async def test_an_idle_stream_closes_while_a_busy_one_stays_and_the_next_request_opens_another(start_mocker,
                                                                                             monkeypatch):
    monkeypatch.setattr(mux_client, "IDLE_CLOSE_S", 0.3)
    worker = await start_mocker("--speedup-ratio", "0.05")  # slow: a call stays open past the idle close
    mux = MuxWorkerClient()
    try:
        slow = mux.generate(worker.address, request("slow"))
        stream = mux._streams[worker.address]
        await asyncio.sleep(0.6)
        assert stream.usable  # a call is open: the stream (and its keepalive pings) stay
        slow.cancel()
        await asyncio.sleep(0.6)
        assert not stream.usable and stream._task.done()  # idle past IDLE_CLOSE_S: half-closed, the peer ended it

        fast = await start_mocker("--speedup-ratio", "0")
        first = await tokens(mux.generate(fast.address, request("a")))
        await asyncio.sleep(0.6)
        assert not mux._streams[fast.address].usable
        again = await tokens(mux.generate(fast.address, request("a")))  # a fresh stream, the same answer
        assert again == first and len(first) == 8 and mux._streams[fast.address].usable
    finally:
        await mux.close()
