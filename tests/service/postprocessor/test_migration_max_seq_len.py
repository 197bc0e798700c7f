"""--migration-max-seq-len (DYN_MIGRATION_MAX_SEQ_LEN) over real gRPC: a real postprocessor server whose migrations
ask a real in-process router, in front of two scripted fake workers (real servers). A request whose prompt +
generated tokens are within the limit moves to the other worker when its worker fails; past it, it fails as it
would without migration, and the refusal is counted by model."""

from __future__ import annotations

import uuid

import grpc
import pytest
from meshfront.common.v1 import common_pb2
from meshfront.postprocessor.v1 import postprocessor_pb2, postprocessor_pb2_grpc
from meshfront.worker.v1 import worker_pb2, worker_pb2_grpc
from prometheus_client import REGISTRY

from services.common.discovery import ModelCard, WorkerCard
from services.common.error_interceptor import ErrorInterceptor
from services.common.grpc_server import GrpcServer
from services.models.qwen import EOS_TOKEN_IDS
from services.postprocessor.migration import Migrator
from services.postprocessor.server import PostprocessorServicer
from services.postprocessor.service import Postprocessor
from services.router.service import Router
from tests.service.postprocessor.fake_worker import Fail, FakeWorker

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]

PROMPT = [151644, 77091, 198]  # <|im_start|>assistant\n
MAX_SEQ_LEN = len(PROMPT) + 4
MODEL = "m-max-seq-len"  # its own label: the counter is the process's
COUNTER = "meshfront_postprocessor_migration_max_seq_len_exceeded_total"


@pytest.fixture(scope="module")
async def mesh(fake_worker):
    """(postprocessor stub, first worker, second worker, second worker's address)."""
    second = FakeWorker()
    second_server = grpc.aio.server(interceptors=[ErrorInterceptor("worker")])
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(second, second_server)
    second_address = f"127.0.0.1:{second_server.add_insecure_port('127.0.0.1:0')}"
    await second_server.start()
    cards = [WorkerCard("w1", fake_worker[1], ModelCard(MODEL, "/m")),
             WorkerCard("w2", second_address, ModelCard(MODEL, "/m"))]
    router = Router(lambda model: [c for c in cards if c.model.name == model])
    postprocessor = Postprocessor(idle_timeout_s=0, migrator=Migrator(router, limit=3, max_seq_len=MAX_SEQ_LEN))
    server = GrpcServer("postprocessor", "127.0.0.1", 0, grace_s=0)
    postprocessor_pb2_grpc.add_PostprocessorServiceServicer_to_server(PostprocessorServicer(postprocessor),
                                                                      server.server)
    await server.start()
    async with grpc.aio.insecure_channel(server.address) as channel:
        yield postprocessor_pb2_grpc.PostprocessorServiceStub(channel), fake_worker[0], second
    await server.stop()
    await postprocessor.close()
    await second_server.stop(0)


def request(demo_model_dir, first_address: str) -> postprocessor_pb2.GenerateRequest:
    req = postprocessor_pb2.GenerateRequest(worker_address=first_address, worker_id="w1")
    req.options.model_dir = str(demo_model_dir)
    req.request.request_id = uuid.uuid4().hex
    req.request.model = MODEL
    req.request.token_ids.extend(PROMPT)
    req.request.stop.stop_token_ids_hidden.extend(EOS_TOKEN_IDS)
    return req


def tokens(ids: list[int]) -> worker_pb2.GenerateResponse:
    return worker_pb2.GenerateResponse(token_ids=ids)


def refused() -> float:
    return REGISTRY.get_sample_value(COUNTER, {"model": MODEL}) or 0.0


async def test_a_request_within_the_limit_migrates_and_one_past_it_fails(mesh, fake_worker, demo_model_dir):
    stub, first, second = mesh
    eos = worker_pb2.GenerateResponse(token_ids=[EOS_TOKEN_IDS[0]], finish_reason=common_pb2.FINISH_REASON_EOS)
    within = request(demo_model_dir, fake_worker[1])  # 3 prompt + 4 generated = the limit, not past it
    first.script(within.request.request_id, [tokens([9707, 11, 1879, 0]), 0.05, Fail()])
    second.script(within.request.request_id, [tokens([1234]), eos])
    before = refused()
    responses = [r async for r in stub.Generate(within)]
    assert responses[-1].finish_reason == common_pb2.FINISH_REASON_EOS and responses[-1].completion_tokens + sum(
        r.completion_tokens for r in responses[:-1]) == 6
    assert [r.request.request_id for r in second.received] == [within.request.request_id]
    assert list(second.received[-1].request.token_ids) == [*PROMPT, 9707, 11, 1879, 0]  # the continuation
    assert refused() == before

    past = request(demo_model_dir, fake_worker[1])  # 3 prompt + 5 generated: past the limit
    first.script(past.request.request_id, [tokens([9707, 11, 1879, 0, 5]), 0.05, Fail()])
    second.script(past.request.request_id, [eos])
    call = stub.Generate(past)
    assert (await call.read()).completion_tokens == 5
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.read()
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # the worker's failure, as without migration
    assert past.request.request_id not in [r.request.request_id for r in second.received]
    assert refused() == before + 1
