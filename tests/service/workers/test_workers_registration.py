"""A mocker process (text, or its media kind) registers its card in NATS discovery, serves, and deregisters on
SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import grpc
import pytest
from meshfront.common.v1 import common_pb2
from meshfront.worker.v1 import media_pb2, media_pb2_grpc, worker_pb2, worker_pb2_grpc

from services.common.discovery import VIDEOS, WorkerRegistry
from tests.conftest import wait_for

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]


async def test_worker_registers_serves_and_deregisters_on_sigterm(nats_url, model_dir):
    registry = WorkerRegistry(nats_url, "test-registry")
    await registry.start()
    worker = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.workers.mocker", "--model-dir", str(model_dir), "--model-name", "demo",
        "--port", "0", "--nats-url", nats_url, "--worker-id", "mocker-regtest1", "--speedup-ratio", "0",
        "--tool-call-parser", "hermes", "--log-level", "WARNING",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        ready = await asyncio.wait_for(worker.stdout.readline(), 30)
        assert ready.startswith(b"READY worker-mocker "), ready
        address = ready.split()[-1].decode()
        await wait_for(lambda: "mocker-regtest1" in registry.workers, 20, "the worker card")
        card = registry.workers["mocker-regtest1"]
        assert card.address == address and card.kind == "mocker"
        assert card.model.name == "demo" and card.model.tool_call_parser == "hermes"
        assert card.model.context_length == 4096 and card.model.block_size == 16
        assert card.total_kv_blocks == 16384 and card.max_num_batched_tokens == 8192

        async with grpc.aio.insecure_channel(card.address) as channel:
            stub = worker_pb2_grpc.WorkerServiceStub(channel)
            request = worker_pb2.GenerateRequest(request=common_pb2.PreprocessedRequest(
                token_ids=[1, 2, 3], stop=common_pb2.StopConditions(max_tokens=5)))
            tokens = [t async for m in stub.Generate(request) for t in m.token_ids]
        assert len(tokens) == 5

        worker.send_signal(signal.SIGTERM)
        await wait_for(lambda: "mocker-regtest1" not in registry.workers, 15, "deregistration")
        assert await asyncio.wait_for(worker.wait(), 15) == 0
    finally:
        if worker.returncode is None:
            worker.kill()
            await worker.wait()
        await registry.close()


async def test_a_media_simulator_registers_a_media_card_and_serves_media_service(nats_url):
    registry = WorkerRegistry(nats_url, "test-registry")
    await registry.start()
    worker = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.workers.mocker", "--media", "video", "--model-name", "demo-video",
        "--port", "0", "--nats-url", nats_url, "--worker-id", "mocker-media1", "--media-max-frames", "48",
        "--log-level", "WARNING",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        ready = await asyncio.wait_for(worker.stdout.readline(), 30)
        assert ready.startswith(b"READY worker-mocker "), ready
        await wait_for(lambda: "mocker-media1" in registry.workers, 20, "the worker card")
        card = registry.workers["mocker-media1"]
        assert card.kind == "mocker" and card.model.endpoints == (VIDEOS,) and card.model.model_dir == ""
        assert card.model.media is not None and card.model.media.max_frames == 48
        assert card.total_kv_blocks == 0  # no KV cache to route by
        async with grpc.aio.insecure_channel(card.address) as channel:
            events = [e async for e in media_pb2_grpc.MediaServiceStub(channel).GenerateMedia(
                media_pb2.GenerateMediaRequest(kind=media_pb2.MEDIA_KIND_VIDEO, width=64, height=48, num_frames=4,
                                               fps=4.0, num_inference_steps=2, output_format="mjpeg"))]
        assert events[-1].done.content_type == "video/x-msvideo" and events[-1].done.num_frames == 4
        worker.send_signal(signal.SIGTERM)
        await wait_for(lambda: "mocker-media1" not in registry.workers, 15, "deregistration")
        assert await asyncio.wait_for(worker.wait(), 15) == 0
    finally:
        if worker.returncode is None:
            worker.kill()
            await worker.wait()
        await registry.close()
