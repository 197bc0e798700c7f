"""The gateway's media pipeline over the real router (in-process) and the mocker's image simulator behind a
real MediaService on a loopback port: retry past a dead worker, releases, and a close that stops the
worker's step loop."""

from __future__ import annotations

import asyncio
import time

import pytest
from meshfront.worker.v1 import media_pb2

from services.allinone.clients import InProcessRouter
from services.common.errors import InvalidRequest, WorkerFailed
from services.gateway.media.pipeline import MediaPipeline
from services.gateway.media.worker_client import GrpcMediaWorker
from services.launcher.plan import free_port
from services.router.service import Router
from services.workers.media.server import build_server, media_card
from services.workers.media.service import MediaService
from services.workers.mocker.config import parse_config
from services.workers.mocker.media_engine import SimulatedMediaEngine

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]

MODEL = "demo-image"


@pytest.fixture
async def live_worker():
    cfg = parse_config(["--media", "image", "--model-name", MODEL, "--port", "0", "--no-register",
                        "--media-step-ms", "20"], env={})
    assert cfg.media is not None
    engine = SimulatedMediaEngine(cfg.media)
    server = build_server(cfg.worker, MediaService(engine, cfg.jobs))
    server.grace_s = 0
    await server.start()
    yield media_card(cfg.worker, server.address, engine.limits), engine
    await server.stop()


def pipeline_over(cards) -> tuple[MediaPipeline, GrpcMediaWorker, Router]:
    router = Router(lambda model: [c for c in cards if c.model.name == model])
    workers = GrpcMediaWorker()
    return MediaPipeline(InProcessRouter(router), workers), workers, router


def request(rid: str, steps: int = 2, output_format: str = "png") -> media_pb2.GenerateMediaRequest:
    return media_pb2.GenerateMediaRequest(request_id=rid, model=MODEL, kind=media_pb2.MEDIA_KIND_IMAGE,
                                          prompt="a cat", width=64, height=64, n=1, num_inference_steps=steps,
                                          seed=1, output_format=output_format)


async def collect(pipeline: MediaPipeline, req) -> list[media_pb2.GenerateMediaResponse]:
    return [e async for e in pipeline.run(req)]


async def test_a_dead_worker_is_skipped_and_the_request_succeeds(live_worker):
    card, _ = live_worker
    dead = type(card)(worker_id="dead", address=f"127.0.0.1:{free_port()}", model=card.model, kind="mocker")
    pipeline, workers, router = pipeline_over([dead, card])
    try:
        for i in range(4):  # round-robin hands the dead worker every other first attempt
            events = await asyncio.wait_for(collect(pipeline, request(f"r{i}")), 30)
            assert events[-1].HasField("done") and any(e.HasField("chunk") for e in events)
        await asyncio.sleep(0.05)  # the fire-and-forget releases
        assert router.bookings.prompt_tokens(card.worker_id) == 0
    finally:
        await workers.close()


async def test_only_a_dead_worker_is_worker_failed_and_a_bad_request_stays_a_400(live_worker):
    card, _ = live_worker
    dead = type(card)(worker_id="dead", address=f"127.0.0.1:{free_port()}", model=card.model, kind="mocker")
    pipeline, workers, _ = pipeline_over([dead])
    try:
        with pytest.raises(WorkerFailed):
            await asyncio.wait_for(collect(pipeline, request("r")), 30)
    finally:
        await workers.close()
    pipeline, workers, _ = pipeline_over([card])
    try:
        with pytest.raises(InvalidRequest):  # the worker's own 400 is not retried elsewhere
            await asyncio.wait_for(collect(pipeline, request("r", output_format="gif")), 30)
    finally:
        await workers.close()


async def test_closing_the_iterator_stops_the_workers_step_loop(live_worker):
    card, engine = live_worker
    pipeline, workers, _ = pipeline_over([card])
    try:
        events = pipeline.run(request("r", steps=100))  # 100 steps of 20 ms: 2 s if nobody stops it
        first = await asyncio.wait_for(anext(events), 30)
        assert first.HasField("progress")
        await events.aclose()
        closed = time.monotonic()
        taken = engine.steps_taken
        await asyncio.sleep(0.5)
        assert engine.steps_taken - taken <= 2, "the worker kept denoising after the gateway hung up"
        assert engine.last_step_at - closed < 0.2
    finally:
        await workers.close()
