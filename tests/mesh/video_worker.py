"""A small video worker for the gateway's video tests (``python -m tests.mesh.video_worker``).

It serves ``MediaService.GenerateMedia`` as a media worker does: a progress event per denoising step
(``--step-s`` apart), then a real video encoded with PyAV (H.264 MP4, or MJPEG frames in AVI) in 1 MiB
chunks, then ``done``; frames are drawn from the seed, so the same request gives the same bytes. It
registers a VIDEOS model card in NATS with the normal ``Registrar``. It stands in for an engine in the
gateway's tests, which need a worker whose timing they control (a gateway killed mid-generation).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import uuid
from fractions import Fraction

import av
import numpy as np
from meshfront.worker.v1 import media_pb2, media_pb2_grpc

from services.common.discovery import VIDEOS, MediaLimits, ModelCard, Registrar, WorkerCard
from services.common.grpc_server import GrpcServer

CHUNK = 1 << 20
LIMITS = MediaLimits(max_width=256, max_height=256, size_multiple=16, default_width=64, default_height=48,
                     max_n=1, default_steps=4, max_steps=50, output_formats=("mp4", "mjpeg"), default_fps=8.0,
                     max_frames=64, default_frames=16, takes_image=True)
CONTENT_TYPES = {"mp4": "video/mp4", "mjpeg": "video/x-msvideo"}


def encode(req: media_pb2.GenerateMediaRequest) -> bytes:
    rng = np.random.default_rng(req.seed)
    base = rng.integers(0, 256, size=(req.height, req.width, 3), dtype=np.uint8)
    fmt, codec, pix = ("mp4", "libx264", "yuv420p") if req.output_format == "mp4" else ("avi", "mjpeg", "yuvj420p")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"out.{fmt}")
        with av.open(path, "w", format=fmt) as container:
            stream = container.add_stream(codec, rate=Fraction(req.fps).limit_denominator(1001))
            stream.width, stream.height, stream.pix_fmt = req.width, req.height, pix
            for i in range(req.num_frames):
                frame = av.VideoFrame.from_ndarray(np.roll(base, i * 2, axis=1), format="rgb24")
                frame.pts = i
                container.mux(stream.encode(frame))
            container.mux(stream.encode(None))
        with open(path, "rb") as f:
            return f.read()


class VideoServicer(media_pb2_grpc.MediaServiceServicer):
    def __init__(self, step_s: float):
        self.step_s = step_s

    async def GenerateMedia(self, request, context):
        started = time.monotonic()
        for step in range(1, request.num_inference_steps + 1):
            await asyncio.sleep(self.step_s)
            yield media_pb2.GenerateMediaResponse(progress=media_pb2.MediaProgress(
                step=step, total_steps=request.num_inference_steps))
        data = await asyncio.to_thread(encode, request)
        for pos in range(0, len(data), CHUNK):
            yield media_pb2.GenerateMediaResponse(chunk=media_pb2.MediaChunk(
                index=0, data=data[pos:pos + CHUNK], last=pos + CHUNK >= len(data)))
        yield media_pb2.GenerateMediaResponse(done=media_pb2.MediaDone(
            inference_time_s=time.monotonic() - started, content_type=CONTENT_TYPES[request.output_format],
            num_frames=request.num_frames, fps=request.fps))


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--nats", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--step-s", type=float, default=0.05)
    args = p.parse_args()
    server = GrpcServer("test-video-worker", "127.0.0.1", args.port)
    media_pb2_grpc.add_MediaServiceServicer_to_server(VideoServicer(args.step_s), server.server)
    await server.start()
    card = WorkerCard(worker_id=uuid.uuid4().hex[:12], address=f"127.0.0.1:{args.port}", kind="test-video",
                      model=ModelCard(name=args.model, model_dir="", endpoints=(VIDEOS,), media=LIMITS))
    registrar = Registrar(args.nats, card)
    await registrar.start()
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
