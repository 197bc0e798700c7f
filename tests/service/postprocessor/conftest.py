"""A real postprocessor server on 127.0.0.1:0 in front of a scripted fake worker (also a real server)."""

from __future__ import annotations

import grpc
import pytest
from meshfront.postprocessor.v1 import postprocessor_pb2_grpc
from meshfront.worker.v1 import worker_pb2_grpc

from services.common.error_interceptor import ErrorInterceptor
from services.common.grpc_server import GrpcServer
from services.postprocessor.server import PostprocessorServicer
from services.postprocessor.service import Postprocessor
from tests.service.postprocessor.fake_worker import FakeWorker


@pytest.fixture(scope="module")
async def fake_worker():
    worker = FakeWorker()
    server = grpc.aio.server(interceptors=[ErrorInterceptor("worker")])
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(worker, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield worker, f"127.0.0.1:{port}"
    await server.stop(0)


@pytest.fixture(scope="module")
async def postprocessor_stub():
    postprocessor = Postprocessor()  # the real gRPC worker client, as in production
    server = GrpcServer("postprocessor", "127.0.0.1", 0, grace_s=0)
    servicer = PostprocessorServicer(postprocessor)
    postprocessor_pb2_grpc.add_PostprocessorServiceServicer_to_server(servicer, server.server)
    await server.start()
    channel = grpc.aio.insecure_channel(server.address)
    yield postprocessor_pb2_grpc.PostprocessorServiceStub(channel)
    await channel.close()
    await server.stop()
    await postprocessor.close()
