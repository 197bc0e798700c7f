"""A gateway serving KServe v2 on 127.0.0.1:0 over the real stages in-process and a real mocker worker.

Everything but NATS is real: the worker is a gRPC server, the preprocessor,
router and postprocessor run in-process behind the gateway's own client seam
(the all-in-one shape's clients, services/allinone/clients.py), and a fixed worker table stands in for discovery.
"""

from __future__ import annotations

import dataclasses

import pytest

from services.allinone import clients
from services.common.grpc_server import GrpcServer
from services.gateway.core.pipeline import Pipeline
from services.gateway.kserve.server import KServeServicer, add_to_server
from services.models import default_test_model_dir
from services.postprocessor.service import Postprocessor
from services.preprocessor.service import Preprocessor
from services.router.service import Router
from services.workers.mocker.config import parse_config
from services.workers.mocker.main import build_engine
from services.workers.server import build_server, worker_card
from tests.conftest import MOCKER_SCRIPT

MODEL = "kserve-demo"


@dataclasses.dataclass
class KServeGateway:
    target: str
    workers: dict  # worker id -> WorkerCard; tests may empty it to simulate "no live worker"
    engine: object


@pytest.fixture(scope="module")
async def kserve_gateway():
    cfg = parse_config(["--model-dir", str(default_test_model_dir()), "--model-name", MODEL, "--port", "0",
                        "--no-register", "--script", str(MOCKER_SCRIPT), "--speedup-ratio", "20"], env={})
    engine = build_engine(cfg)
    worker = build_server(cfg.worker, engine)
    worker.grace_s = 0
    await engine.start()
    await worker.start()
    card = worker_card(cfg.worker, worker.address)
    workers = {card.worker_id: card}

    def models():
        out = {}
        for c in workers.values():
            out.setdefault(c.model.name, []).append(c)
        return out

    def workers_for(name):
        return [c for c in workers.values() if c.model.name == name]

    def model(name):
        return next((c.model for c in workers.values() if c.model.name == name), None)

    postprocessor = Postprocessor()
    pipeline = Pipeline(clients.InProcessPreprocessor(Preprocessor(model)),
                        clients.InProcessRouter(Router(workers_for)),
                        clients.InProcessPostprocessor(postprocessor))
    server = GrpcServer("gateway", "127.0.0.1", 0, grace_s=0)
    add_to_server(KServeServicer(pipeline, models), server.server)
    await server.start()
    yield KServeGateway(server.address, workers, engine)
    await server.stop()
    await postprocessor.close()
    await worker.stop()
    await engine.close()
