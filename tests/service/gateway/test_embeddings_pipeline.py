"""The gateway's embeddings pipeline over the real preprocessor and router (in-process, as the all-in-one
shape runs them) and a real embedding worker on a loopback port; a second registered worker is dead."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from services.allinone.clients import InProcessPreprocessor, InProcessRouter
from services.common.discovery import EMBEDDINGS, ModelCard, WorkerCard
from services.common.errors import InvalidRequest, WorkerFailed
from services.gateway.embeddings.pipeline import EmbeddingsPipeline
from services.gateway.embeddings.request import EmbeddingsRequest
from services.gateway.embeddings.worker_client import GrpcEmbedWorker
from services.launcher.plan import free_port
from services.models.minilm import default_embedding_model_dir
from services.preprocessor.service import Preprocessor
from services.router.service import Router
from services.workers.embed.config import parse_config
from services.workers.embed.main import build_service
from services.workers.embed.server import build_server
from tests.conftest import require_module

require_module("torch")

pytestmark = [pytest.mark.service, pytest.mark.timeout(180)]

MODEL = "minilm"


@pytest.fixture(scope="module")
async def live_worker():
    model_dir = default_embedding_model_dir()
    cfg = parse_config(["--model-dir", str(model_dir), "--port", "0", "--no-register", "--model-name", MODEL], env={})
    service = build_service(cfg)
    server = build_server(cfg.worker, service)
    server.grace_s = 0
    service.batcher.start()
    await server.start()
    yield ModelCard(name=MODEL, model_dir=str(model_dir), context_length=256, endpoints=(EMBEDDINGS,)), server.address
    await server.stop()
    await service.batcher.close()


async def pipeline_over(cards: list[WorkerCard]) -> tuple[EmbeddingsPipeline, GrpcEmbedWorker, Router]:
    router = Router(lambda model: [c for c in cards if c.model.name == model])
    preprocessor = Preprocessor(lambda name: next((c.model for c in cards if c.model.name == name), None))
    workers = GrpcEmbedWorker()
    return EmbeddingsPipeline(InProcessPreprocessor(preprocessor), InProcessRouter(router), workers), workers, router


async def test_a_dead_worker_is_skipped_and_the_request_succeeds_on_the_live_one(live_worker):
    model, address = live_worker
    dead = WorkerCard("dead", f"127.0.0.1:{free_port()}", model, kind="embed")  # nothing listens there
    live = WorkerCard("live", address, model, kind="embed")
    pipeline, workers, router = await pipeline_over([dead, live])
    try:
        for i in range(4):  # round-robin hands the dead worker every other first attempt
            resp = await asyncio.wait_for(pipeline.run(EmbeddingsRequest(MODEL, ["hello world", [101, 7592, 102]]),
                                                       f"r{i}"), 30)
            v = np.stack([np.frombuffer(e, dtype="<f4") for e in resp.embeddings])
            assert v.shape == (2, 384) and resp.prompt_tokens == 4 + 3
        await asyncio.sleep(0.05)  # the fire-and-forget releases
        assert router.bookings.prompt_tokens("live") == 0 and router.bookings.prompt_tokens("dead") == 0
    finally:
        await workers.close()


async def test_with_only_a_dead_worker_the_client_hears_worker_failed(live_worker):
    model, _ = live_worker
    pipeline, workers, _ = await pipeline_over([WorkerCard("dead", f"127.0.0.1:{free_port()}", model, kind="embed")])
    try:
        with pytest.raises(WorkerFailed):
            await asyncio.wait_for(pipeline.run(EmbeddingsRequest(MODEL, ["hi"]), "r"), 30)
    finally:
        await workers.close()


async def test_a_workers_400_reaches_the_client_unchanged(live_worker):
    model, address = live_worker
    pipeline, workers, _ = await pipeline_over([WorkerCard("live", address, model, kind="embed")])
    try:
        with pytest.raises(InvalidRequest) as e:
            await asyncio.wait_for(pipeline.run(EmbeddingsRequest(MODEL, ["hi"], dimensions=16), "r"), 30)
        assert e.value.param == "dimensions"
    finally:
        await workers.close()
