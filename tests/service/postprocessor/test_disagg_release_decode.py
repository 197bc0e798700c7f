"""A vLLM pair's release goes to its decode worker: a client that hangs up during the transfer has the prefill
worker's held blocks freed through the decode worker's ``KvTransferService.ReleaseKv`` (the vLLM worker's glue,
services/workers/vllm/release_grpc.py), because the prefill worker's card says ``kv_release_by`` decode.

Real pieces on loopback: the postprocessor with its worker client and KV releaser (reading the cards as the
registry hands them over), a prefill mocker that holds the blocks, and a decode worker that serves the vLLM
worker's ``ReleaseKv`` beside a scripted ``WorkerService`` that never pulls. vLLM's AsyncLLM does not run on this
CPU build with NIXL, so the decode worker's release lands in a recorder standing in for
``VllmEngine.release_kv`` (tests/engine_env/vllm checks that it calls vLLM's own method with these params).
"""

from __future__ import annotations

import asyncio

import grpc
import orjson
import pytest
from meshfront.worker.v1 import worker_pb2_grpc

from services.common.discovery import KV_RELEASE_BY_DECODE, PREFILL, ModelCard, WorkerCard
from services.common.error_interceptor import ErrorInterceptor
from services.postprocessor.kv_release import GrpcKvReleaser
from services.postprocessor.service import Postprocessor
from services.workers.mocker.transfer import transfer_metrics
from services.workers.vllm.release_grpc import add_kv_release
from tests.service.postprocessor.disagg_mockers import received, request
from tests.service.postprocessor.fake_worker import FakeWorker, Forever

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]


@pytest.fixture
async def vllm_decode_worker():
    """A decode worker's server: the scripted WorkerService and the vLLM worker's ReleaseKv, on one port."""
    released: list[dict] = []
    worker = FakeWorker()

    async def release(params: dict) -> None:
        released.append(params)

    server = grpc.aio.server(interceptors=[ErrorInterceptor("worker")])
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(worker, server)
    add_kv_release(server, release)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield worker, f"127.0.0.1:{port}", released
    await server.stop(0)


async def test_a_hang_up_during_the_transfer_sends_the_release_to_the_decode_worker(
        demo_model_dir, mockers, vllm_decode_worker):
    prefill = await mockers("--speedup-ratio", "0")
    worker, address, released = vllm_decode_worker
    cards = [WorkerCard(prefill.id, prefill.address, ModelCard("demo", str(demo_model_dir)), kind="vllm",
                        role=PREFILL, kv_release_by=KV_RELEASE_BY_DECODE)]
    releaser = GrpcKvReleaser(cards=lambda model: cards if model == "demo" else [])
    post = Postprocessor(idle_timeout_s=0, kv_releaser=releaser)
    try:
        req = request(demo_model_dir, prefill, prefill)
        req.worker_address, req.worker_id = address, "vllm-decode"
        rid = req.request.request_id
        cancelled = worker.script(rid, [Forever()])
        prefill_released = transfer_metrics()[0].labels("released")._value.get()
        stream = post.generate(req)
        assert (await stream.__anext__()).completion_tokens == 1
        await asyncio.wait_for(asyncio.shield(received(worker, rid)), 5)  # the decode leg is open: the transfer
        (leg,) = [r.request for r in worker.received if r.request.request_id == rid]
        await stream.aclose()
        async with asyncio.timeout(1):
            while not released:
                await asyncio.sleep(0.005)
        await asyncio.wait_for(cancelled.wait(), 1)  # the decode leg was cancelled too
    finally:
        await post.close()
        await releaser.close()
    # The decode worker got the prefill leg's parameters, untouched; the prefill worker was not asked.
    assert released == [orjson.loads(leg.disaggregation.kv_transfer_params)]
    assert released[0]["do_remote_prefill"] and released[0]["remote_engine_id"] == prefill.id
    assert transfer_metrics()[0].labels("released")._value.get() == prefill_released
