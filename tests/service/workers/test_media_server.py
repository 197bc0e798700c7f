"""The mocker's media simulator behind a real MediaService gRPC server on 127.0.0.1:0: bytes, chunks,
determinism, videos read back with PyAV, cancel, overload and bad inputs, as the gateway will call it."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import io
import threading
import time

import av
import grpc
import pytest
from meshfront.worker.v1 import media_pb2, media_pb2_grpc
from PIL import Image

from services.common.errors import InvalidRequest, Overloaded, from_rpc_error
from services.common.grpc_server import CHANNEL_OPTIONS, GrpcServer
from services.workers.media.encode import encode_image
from services.workers.media.engine import Output
from services.workers.media.server import build_server, media_card
from services.workers.media.service import CHUNK_BYTES, MediaService
from services.workers.mocker.config import parse_config
from services.workers.mocker.media_engine import SimulatedMediaEngine
from tests.conftest import wait_for

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]

IMAGE, VIDEO = media_pb2.MEDIA_KIND_IMAGE, media_pb2.MEDIA_KIND_VIDEO


@dataclasses.dataclass
class MediaWorker:
    stub: media_pb2_grpc.MediaServiceStub
    engine: SimulatedMediaEngine
    service: MediaService
    server: GrpcServer
    cfg: object


@pytest.fixture
async def start_media():
    started = []

    async def start(kind: str = "image", *flags: str) -> MediaWorker:
        cfg = parse_config(["--media", kind, "--model-name", f"demo-{kind}", "--port", "0", "--no-register",
                            "--media-step-ms", "0", *flags], env={})
        assert cfg.media is not None
        engine = SimulatedMediaEngine(cfg.media)
        service = MediaService(engine, cfg.jobs)
        server = build_server(cfg.worker, service)
        server.grace_s = 0
        await server.start()
        channel = grpc.aio.insecure_channel(server.address, options=CHANNEL_OPTIONS)
        started.append((server, channel, service))
        return MediaWorker(media_pb2_grpc.MediaServiceStub(channel), engine, service, server, cfg)

    yield start
    for server, channel, service in started:
        await channel.close()
        await server.stop()
        # An engine thread gives its job's slot back as it ends.
        await wait_for(lambda s=service: s.slots.running == 0, 5, "every engine thread to end")


def image_request(**kw) -> media_pb2.GenerateMediaRequest:
    return media_pb2.GenerateMediaRequest(**{"request_id": "t", "model": "demo-image", "kind": IMAGE, "prompt":
                                             "a lighthouse at dusk", "width": 128, "height": 96, "n": 1,
                                             "num_inference_steps": 4, "seed": 42, "output_format": "png", **kw})


def video_request(**kw) -> media_pb2.GenerateMediaRequest:
    return media_pb2.GenerateMediaRequest(**{"request_id": "t", "model": "demo-video", "kind": VIDEO, "prompt":
                                             "waves on a beach", "width": 160, "height": 96, "n": 1,
                                             "num_inference_steps": 3, "seed": 1, "output_format": "mp4",
                                             "num_frames": 12, "fps": 6.0, **kw})


@dataclasses.dataclass
class Result:
    events: list[media_pb2.GenerateMediaResponse]

    def of(self, kind: str) -> list:
        return [getattr(e, kind) for e in self.events if e.WhichOneof("event") == kind]

    @property
    def outputs(self) -> list[bytes]:
        out: dict[int, bytearray] = {}
        for c in self.of("chunk"):
            out.setdefault(c.index, bytearray()).extend(c.data)
        return [bytes(out[i]) for i in sorted(out)]

    @property
    def done(self) -> media_pb2.MediaDone:
        [done] = self.of("done")
        return done


async def generate(worker: MediaWorker, req: media_pb2.GenerateMediaRequest) -> Result:
    return Result([e async for e in worker.stub.GenerateMedia(req)])


async def error_of(worker: MediaWorker, req: media_pb2.GenerateMediaRequest):
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await generate(worker, req)
    return e.value.code(), from_rpc_error(e.value)


async def test_an_image_arrives_in_its_size_with_progress_then_done(start_media):
    worker = await start_media()
    result = await generate(worker, image_request())
    [data] = result.outputs
    image = Image.open(io.BytesIO(data))
    assert image.format == "PNG" and image.size == (128, 96)
    assert [(p.step, p.total_steps) for p in result.of("progress")] == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert result.events[-1].WhichOneof("event") == "done"
    done = result.done
    assert done.content_type == "image/png" and done.num_frames == 0 and done.fps == 0
    assert done.input_tokens == 4 and done.output_tokens == (128 // 8) * (96 // 8)
    assert done.inference_time_s > 0


async def test_the_same_seed_gives_the_same_bytes_and_another_seed_others(start_media):
    worker = await start_media()
    a, b, c = [(await generate(worker, image_request(seed=s))).outputs[0] for s in (42, 42, 43)]
    assert a == b and a != c


async def test_n_outputs_differ_and_come_one_after_another(start_media):
    worker = await start_media()
    result = await generate(worker, image_request(n=3, output_format="jpeg"))
    outputs = result.outputs
    assert len(outputs) == 3 and len(set(outputs)) == 3
    assert all(Image.open(io.BytesIO(o)).format == "JPEG" for o in outputs)
    # Not interleaved: each output's chunks, its last one flagged, before the next output's.
    chunks = [(c.index, c.last) for c in result.of("chunk")]
    assert chunks == [(0, True), (1, True), (2, True)]
    assert [p.total_steps for p in result.of("progress")] == [12] * 12


async def test_partial_images_come_while_it_denoises(start_media):
    worker = await start_media()
    result = await generate(worker, image_request(num_inference_steps=8, partial_images=2, output_format="webp"))
    partials = result.of("partial")
    assert [(p.index, p.partial_index) for p in partials] == [(0, 0), (0, 1)]
    assert all(Image.open(io.BytesIO(p.data)).format == "WEBP" for p in partials)
    kinds = [e.WhichOneof("event") for e in result.events]
    assert kinds.index("partial") < kinds.index("chunk")


async def test_a_transparent_background_keeps_an_alpha_channel(start_media):
    worker = await start_media()
    [data] = (await generate(worker, image_request(background="transparent"))).outputs
    image = Image.open(io.BytesIO(data))
    assert image.mode == "RGBA" and image.getextrema()[3][0] == 0


async def test_an_mp4_has_the_requested_frames_fps_and_size(start_media):
    worker = await start_media("video")
    result = await generate(worker, video_request())
    [data] = result.outputs
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        frames = list(container.decode(video=0))
        assert stream.codec_context.name == "h264" and float(stream.average_rate) == 6.0
    assert len(frames) == 12 and (frames[0].width, frames[0].height) == (160, 96)
    done = result.done
    assert (done.content_type, done.num_frames, done.fps) == ("video/mp4", 12, 6.0)


async def test_an_mjpeg_decodes_every_frame(start_media):
    worker = await start_media("video")
    [data] = (await generate(worker, video_request(output_format="mjpeg", num_frames=9, fps=3.0))).outputs
    with av.open(io.BytesIO(data)) as container:
        frames = list(container.decode(video=0))
        assert container.streams.video[0].codec_context.name == "mjpeg"
    assert len(frames) == 9 and len({f.to_image().tobytes() for f in frames}) == 9


async def test_a_50_mb_output_arrives_intact_in_chunks_of_at_most_1_mib(start_media):
    worker = await start_media("image", "--media-noise", "--media-max-size", "4096x4096")
    req = image_request(width=4096, height=4096, num_inference_steps=1)
    result = await generate(worker, req)
    chunks = result.of("chunk")
    assert all(len(c.data) <= CHUNK_BYTES for c in chunks) and [c.last for c in chunks].count(True) == 1
    assert chunks[-1].last and len(chunks) >= 48
    [data] = result.outputs
    assert len(data) > 50_000_000
    # The bytes the engine drew, encoded here: what crossed gRPC is those bytes, in order.
    [output] = [e for e in worker.engine.generate(await asyncio.to_thread(_job, worker, req), threading.Event())
                if isinstance(e, Output)]
    expected = await asyncio.to_thread(encode_image, output.frames[0], "png")
    assert hashlib.sha256(data).digest() == hashlib.sha256(expected).digest()


def _job(worker: MediaWorker, req: media_pb2.GenerateMediaRequest):
    from services.workers.media.checks import build_job

    return build_job(req, worker.engine.limits)


async def test_a_cancelled_call_stops_the_step_loop_within_a_step(start_media):
    worker = await start_media("image", "--media-step-ms", "100", "--media-max-steps", "1000")
    call = worker.stub.GenerateMedia(image_request(num_inference_steps=1000))
    async for event in call:
        if event.progress.step >= 3:
            break
    cancelled_at = time.monotonic()
    call.cancel()
    await wait_for(lambda: worker.service.slots.running == 0, 5, "the engine thread to end")
    steps = worker.engine.steps_taken
    assert steps < 10, f"{steps} steps of 1000 ran"
    # The engine's last step ended well under a second after the cancel (a step is 100 ms).
    assert worker.engine.last_step_at - cancelled_at < 1.0
    await asyncio.sleep(0.3)
    assert worker.engine.steps_taken == steps


async def test_beyond_the_waiting_jobs_a_call_is_refused_as_overloaded(start_media):
    worker = await start_media("image", "--media-step-ms", "50", "--max-running-jobs", "1",
                               "--max-waiting-jobs", "1", "--media-max-steps", "1000")
    running = worker.stub.GenerateMedia(image_request(num_inference_steps=1000))
    await running.read()  # the first step: it holds the slot
    waiting = asyncio.ensure_future(generate(worker, image_request(num_inference_steps=1)))
    for _ in range(200):
        if worker.service.slots.waiting == 1:
            break
        await asyncio.sleep(0.01)
    assert worker.service.slots.waiting == 1
    code, err = await error_of(worker, image_request())
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and isinstance(err, Overloaded)
    assert "1 jobs running and 1 waiting" in err.message
    running.cancel()
    result = await asyncio.wait_for(waiting, 10)  # the waiting one gets the slot once the first let go
    assert len(result.outputs) == 1


@pytest.mark.parametrize("kw,message", [
    (dict(input_image=b"\x89PNG\r\n\x1a\n not really"), "input_image is not a valid PNG, JPEG or WebP image"),
    (dict(width=4096), "size 4096x96 is larger than this model's largest, 2048x2048"),
    (dict(n=11), "n must be between 1 and 10, got 11"),
    (dict(output_format="mp4"), "output_format must be one of png, jpeg, webp, got 'mp4'"),
    (dict(kind=VIDEO), "The model `demo-image` generates images, not videos"),
])
async def test_bad_requests_are_invalid_argument_with_a_clear_message(start_media, kw, message):
    worker = await start_media()
    code, err = await error_of(worker, image_request(**kw))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and isinstance(err, InvalidRequest)
    assert message in err.message
    assert worker.engine.steps_taken == 0  # refused before the engine saw it


async def test_an_odd_mp4_size_is_refused_and_image_to_video_starts_from_the_input(start_media):
    worker = await start_media("video", "--media-size-multiple", "1")
    code, err = await error_of(worker, video_request(width=161))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "even width and height" in err.message
    source = Image.new("RGB", (160, 96), (250, 20, 20))
    buf = io.BytesIO()
    source.save(buf, "PNG")
    [data] = (await generate(worker, video_request(input_image=buf.getvalue(), output_format="mjpeg"))).outputs
    with av.open(io.BytesIO(data)) as container:
        first = next(container.decode(video=0)).to_image()
    r, g, b = first.getpixel((80, 48))
    assert r > 200 and g < 60 and b < 60, first.getpixel((80, 48))


async def test_the_card_is_an_images_or_videos_model_with_the_engines_limits(start_media):
    for kind, endpoint in (("image", "images"), ("video", "videos")):
        worker = await start_media(kind)
        card = media_card(worker.cfg.worker, worker.server.address, worker.engine.limits)
        assert card.model.endpoints == (endpoint,) and card.model.is_media and card.kind == "mocker"
        assert card.model.media == worker.engine.limits
        assert type(card).from_json(card.to_json()) == card
