"""One video generation's events read in order (media/runner.py VideoRun): progress until the first chunk,
the chunks, then done; a worker stream out of that order is WorkerFailed, never a truncated video."""

from __future__ import annotations

import pytest
from meshfront.worker.v1 import media_pb2

from services.common.errors import WorkerFailed
from services.gateway.media.runner import VideoRun
from services.gateway.media.video_spec import VideoSpec, media_request

pytestmark = pytest.mark.unit


def progress(step: int, total: int = 3):
    return media_pb2.GenerateMediaResponse(progress=media_pb2.MediaProgress(step=step, total_steps=total))


def chunk(data: bytes, last: bool = False, index: int = 0):
    return media_pb2.GenerateMediaResponse(chunk=media_pb2.MediaChunk(index=index, data=data, last=last))


def done():
    return media_pb2.GenerateMediaResponse(done=media_pb2.MediaDone(inference_time_s=1.5, content_type="video/mp4"))


async def events(*items):
    for item in items:
        yield item


async def read(*items) -> tuple[list[tuple[int, int]], bytes, VideoRun]:
    run = VideoRun(events(*items))
    steps = [s async for s in run.progress()]
    data = b"".join([c async for c in run.chunks()])
    return steps, data, run


async def test_progress_then_chunks_then_done():
    steps, data, run = await read(progress(1), progress(2), progress(3), chunk(b"ab"), chunk(b"cd", last=True),
                                  done())
    assert steps == [(1, 3), (2, 3), (3, 3)] and data == b"abcd"
    assert run.done is not None and run.done.inference_time_s == 1.5


async def test_chunks_without_reading_progress_first():
    run = VideoRun(events(progress(1), chunk(b"x", last=True), done()))
    assert b"".join([c async for c in run.chunks()]) == b"x" and run.done is not None


@pytest.mark.parametrize("items", [
    (progress(1), done()),  # no video at all
    (progress(1),),  # the stream ends before a chunk
    (chunk(b"a"), done()),  # done before the last chunk
    (chunk(b"a"),),  # the stream ends inside the video
    (chunk(b"a", last=True), chunk(b"b", last=True), done()),  # a second video
    (chunk(b"a", last=True),),  # no closing report
])
async def test_out_of_order_streams_fail(items):
    with pytest.raises(WorkerFailed):
        await read(*items)


def test_the_worker_request():
    spec = VideoSpec(model="v", prompt="p", width=64, height=48, fps=8.0, num_frames=16, steps=4, seed=9,
                     output_format="mjpeg", negative_prompt="n", guidance_scale=3.5, input_image=b"img")
    req = media_request(spec, "rid")
    assert (req.kind, req.n, req.width, req.height, req.num_frames, req.fps, req.num_inference_steps, req.seed,
            req.output_format, req.negative_prompt, req.guidance_scale, req.input_image, req.request_id) == (
        media_pb2.MEDIA_KIND_VIDEO, 1, 64, 48, 16, 8.0, 4, 9, "mjpeg", "n", 3.5, b"img", "rid")
    assert not media_request(VideoSpec(model="v", prompt="p", width=64, height=48, fps=8.0, num_frames=1, steps=1,
                                       seed=0), "r").HasField("guidance_scale")
