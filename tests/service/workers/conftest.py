"""Real worker servers on 127.0.0.1:0, built in-process from the same pieces ``__main__`` uses."""

from __future__ import annotations

import dataclasses

import grpc
import pytest
from meshfront.worker.v1 import worker_pb2_grpc

from services.common.grpc_server import CHANNEL_OPTIONS, GrpcServer
from services.models import default_test_model_dir
from services.workers.mocker.config import parse_config
from services.workers.mocker.engine import MockerEngine
from services.workers.mocker.main import build_engine
from services.workers.server import build_server


@pytest.fixture(scope="session")
def model_dir():
    return default_test_model_dir()


@dataclasses.dataclass
class RunningWorker:
    stub: worker_pb2_grpc.WorkerServiceStub
    engine: MockerEngine
    address: str
    server: GrpcServer


@pytest.fixture
async def start_mocker(model_dir):
    """Starts a mocker worker with extra flags; stops everything at teardown and checks for leaks."""
    started = []

    async def start(*flags: str) -> RunningWorker:
        cfg = parse_config(["--model-dir", str(model_dir), "--port", "0", "--no-register", *flags], env={})
        engine = build_engine(cfg)
        server = build_server(cfg.worker, engine)
        server.grace_s = 0
        await engine.start()
        await server.start()
        channel = grpc.aio.insecure_channel(server.address, options=CHANNEL_OPTIONS)
        started.append((server, engine, channel))
        return RunningWorker(worker_pb2_grpc.WorkerServiceStub(channel), engine, server.address, server)

    yield start
    for server, engine, channel in started:
        await channel.close()
        await server.stop()
        await engine.close()
        assert engine.cache.active_blocks == 0, "a finished or cancelled call left KV blocks held"
