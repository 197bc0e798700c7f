"""A real postprocessor server on 127.0.0.1:0 in front of a scripted fake worker (also a real server); and for the
disaggregation tests, a postprocessor object (``post``) and real mockers started as their processes build them
(``mockers``; their helpers are in disagg_mockers.py)."""

from __future__ import annotations

import grpc
import pytest
from meshfront.postprocessor.v1 import postprocessor_pb2_grpc
from meshfront.worker.v1 import worker_pb2_grpc

from services.common.error_interceptor import ErrorInterceptor
from services.common.grpc_server import GrpcServer
from services.postprocessor.server import PostprocessorServicer
from services.postprocessor.service import Postprocessor
from services.workers import entry
from services.workers.mocker import main as mocker_main
from services.workers.mocker.config import parse_config
from tests.service.postprocessor.disagg_mockers import Mocker
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


@pytest.fixture
async def mockers(demo_model_dir, monkeypatch):
    """Start mockers with extra flags; each built as ``meshfront mocker`` builds itself."""
    started: list[Mocker] = []
    engines = []
    real_build_engine = mocker_main.build_engine

    def keep(*args, **kwargs):
        engines.append(real_build_engine(*args, **kwargs))
        return engines[-1]

    monkeypatch.setattr(mocker_main, "build_engine", keep)

    async def start(*flags: str) -> Mocker:
        cfg = parse_config(["--model-dir", str(demo_model_dir), "--port", "0", "--no-register", *flags], env={})
        serving = await mocker_main.build(cfg, entry.KvEvents())
        serving.server.grace_s = 0
        await serving.server.start()
        started.append(Mocker(serving, engines[-1]))
        return started[-1]

    yield start
    for m in started:
        await m.serving.server.stop()
        for close in m.serving.closers:
            await close()


@pytest.fixture
async def post():
    postprocessor = Postprocessor(idle_timeout_s=0)
    yield postprocessor
    await postprocessor.close()
