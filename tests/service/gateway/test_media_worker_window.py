"""The gateway's channel to a media worker holds a bounded window: a worker that sends a large result faster
than the gateway passes it on waits, instead of the gateway buffering the whole result (issue 18: no process
holds more than two chunks of a 50 MB video; `python -m bench media-transfer` measured the gateway's RSS)."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from meshfront.worker.v1 import media_pb2, media_pb2_grpc

from services.common.grpc_server import CHANNEL_OPTIONS
from services.gateway.media.worker_client import MEDIA_RECEIVE_WINDOW, GrpcMediaWorker

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]

CHUNK = 1 << 20
CHUNKS = 48


class FastWorker(media_pb2_grpc.MediaServiceServicer):
    """Streams CHUNKS chunks of 1 MiB as fast as gRPC takes them, counting those gRPC has taken."""

    def __init__(self) -> None:
        self.sent = 0

    async def GenerateMedia(self, request, context):
        data = bytes(CHUNK)
        for i in range(CHUNKS):
            yield media_pb2.GenerateMediaResponse(
                chunk=media_pb2.MediaChunk(index=0, data=data, last=i == CHUNKS - 1))
            self.sent += 1
        yield media_pb2.GenerateMediaResponse(done=media_pb2.MediaDone(content_type="video/mp4"))


@pytest.fixture
async def fast_worker():
    server = grpc.aio.server(options=CHANNEL_OPTIONS)
    worker = FastWorker()
    media_pb2_grpc.add_MediaServiceServicer_to_server(worker, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield worker, f"127.0.0.1:{port}"
    await server.stop(0)


async def test_a_worker_cannot_get_far_ahead_of_a_slow_reader(fast_worker):
    worker, address = fast_worker
    client = GrpcMediaWorker()
    events = client.generate(address, media_pb2.GenerateMediaRequest(request_id="r", model="m"))
    try:
        first = await anext(events)
        assert first.chunk.data
        await asyncio.sleep(1.5)  # the gateway busy elsewhere: its client (Envoy) reads slowly
        # What the worker got rid of sits in the gateway's receive window (and the sockets' buffers).
        ahead = worker.sent - 1
        assert ahead * CHUNK <= MEDIA_RECEIVE_WINDOW + 2 * CHUNK, f"the worker got {ahead} chunks ahead"
        received = 1 + sum([1 async for e in events if e.HasField("chunk")])
        assert received == CHUNKS  # bounded, not lossy
    finally:
        await events.aclose()
        await client.close()
