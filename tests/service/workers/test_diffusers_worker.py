"""``meshfront diffusers`` over the tiny random pipelines built in code (services/models/tiny_diffusion.py):
the engine in-process, then behind a real MediaService server on a loopback port.

64x64 images, 2 steps, so the whole file runs in seconds on a CPU; the pipelines load through
``DiffusionPipeline.from_pretrained`` from the saved directories, as a real model does.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import threading
import time

import grpc
import pytest
from meshfront.worker.v1 import media_pb2, media_pb2_grpc
from PIL import Image

from services.common.discovery import IMAGES, VIDEOS
from services.common.errors import InvalidRequest
from services.common.grpc_server import CHANNEL_OPTIONS
from services.workers.media.engine import MediaJob, Output, Preview, StepDone
from tests.conftest import require_module

require_module("diffusers")

pytestmark = [pytest.mark.service, pytest.mark.timeout(240)]

TEXT_TO_IMAGE, IMAGE_TO_IMAGE, TEXT_TO_VIDEO = "text-to-image", "image-to-image", "text-to-video"


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    from services.models.tiny_diffusion import build_tiny_diffusion

    start = time.monotonic()
    root = build_tiny_diffusion(tmp_path_factory.mktemp("tiny-diffusion") / "models")
    assert time.monotonic() - start < 120, "building the tiny pipelines should take seconds"
    return root


def test_the_build_is_normal_diffusers_directories_and_a_second_build_reuses_it(tiny_dirs):
    from services.models.tiny_diffusion import build_tiny_diffusion

    for task, cls in ((TEXT_TO_IMAGE, "StableDiffusionPipeline"), (IMAGE_TO_IMAGE, "StableDiffusionImg2ImgPipeline"),
                      (TEXT_TO_VIDEO, "AnimateDiffPipeline")):
        index = json.loads((tiny_dirs / task / "model_index.json").read_text())
        assert index["_class_name"] == cls and index["tokenizer"] == ["transformers", "CLIPTokenizer"]
    stamp = (tiny_dirs / TEXT_TO_IMAGE / "model_index.json").stat().st_mtime_ns
    start = time.monotonic()
    assert build_tiny_diffusion(tiny_dirs) == tiny_dirs
    assert time.monotonic() - start < 1.0
    assert (tiny_dirs / TEXT_TO_IMAGE / "model_index.json").stat().st_mtime_ns == stamp


def _config(model_dir, *flags: str):
    from services.workers.diffusers.config import parse_config

    return parse_config(["--model-dir", str(model_dir), "--port", "0", "--no-register", "--threads", "1",
                         "--default-steps", "2", *flags], env={})


@pytest.fixture(scope="module")
def engines(tiny_dirs):
    """One engine per task, built as main.py builds it."""
    from services.workers.diffusers.main import build_engine

    built = {task: build_engine(_config(tiny_dirs / task)) for task in (TEXT_TO_IMAGE, IMAGE_TO_IMAGE, TEXT_TO_VIDEO)}
    yield built
    for engine in built.values():
        engine.close()


def job(**changes) -> MediaJob:
    fields = dict(kind="image", prompt="a red cat", negative_prompt="", width=64, height=64, n=1, steps=2,
                  guidance_scale=None, seed=7, input_image=None, mask=None, num_frames=0, fps=0.0, partial_images=0)
    return MediaJob(**{**fields, **changes})


def run(engine, j: MediaJob, cancelled: threading.Event | None = None) -> list:
    return list(engine.generate(j, cancelled or threading.Event()))


def outputs(events) -> list[list[Image.Image]]:
    return [e.frames for e in events if isinstance(e, Output)]


def digest(image: Image.Image) -> str:
    return hashlib.sha256(image.tobytes()).hexdigest()


def test_the_same_seed_gives_the_same_pixels_and_another_seed_others(engines):
    engine = engines[TEXT_TO_IMAGE]
    [[a]], [[b]], [[c]] = (outputs(run(engine, job(seed=s))) for s in (7, 7, 8))
    assert digest(a) == digest(b)
    assert digest(a) != digest(c)


def test_n_outputs_are_seed_plus_i_each_alone_in_its_call(engines):
    engine = engines[TEXT_TO_IMAGE]
    three = [frames[0] for frames in outputs(run(engine, job(n=3, seed=20)))]
    assert len({digest(i) for i in three}) == 3
    [[second]] = outputs(run(engine, job(n=1, seed=21)))
    assert digest(second) == digest(three[1])  # output i does not depend on n


@pytest.mark.parametrize(("width", "height"), [(64, 64), (48, 32), (32, 96)])
def test_outputs_have_exactly_the_size_asked_for(engines, width, height):
    [[image]] = outputs(run(engines[TEXT_TO_IMAGE], job(width=width, height=height)))
    assert image.size == (width, height)


def test_progress_counts_every_outputs_steps_and_previews_come_at_spread_steps(engines):
    events = run(engines[TEXT_TO_IMAGE], job(n=2, steps=3, partial_images=2, width=48, height=32))
    steps = [(e.step, e.total_steps) for e in events if isinstance(e, StepDone)]
    assert steps == [(i, 6) for i in range(1, 7)]
    previews = [(e.index, e.partial_index, e.image.size) for e in events if isinstance(e, Preview)]
    assert previews == [(0, 0, (48, 32)), (0, 1, (48, 32)), (1, 0, (48, 32)), (1, 1, (48, 32))]
    kinds = [type(e).__name__ for e in events]
    assert kinds.index("Output") > max(i for i, k in enumerate(kinds[:kinds.index("Output")]) if k == "Preview")


def test_image_to_image_follows_the_input_image_at_the_size_asked_for(engines):
    red, blue = Image.new("RGB", (40, 30), "red"), Image.new("RGB", (40, 30), "blue")
    for task in (IMAGE_TO_IMAGE, TEXT_TO_IMAGE):  # the img2img dir, and img2img derived from the text-to-image one
        engine = engines[task]
        assert engine.limits.takes_image
        [[from_red]] = outputs(run(engine, job(input_image=red, width=48, height=64)))
        [[from_blue]] = outputs(run(engine, job(input_image=blue, width=48, height=64)))
        assert from_red.size == (48, 64)
        assert digest(from_red) != digest(from_blue)


def test_an_image_to_image_model_refuses_a_job_without_an_image(engines):
    with pytest.raises(InvalidRequest, match="needs an input image") as e:
        run(engines[IMAGE_TO_IMAGE], job())
    assert e.value.param == "input_image"


def test_a_mask_edits_through_the_inpainting_pipeline_of_the_same_components(engines):
    engine = engines[TEXT_TO_IMAGE]
    source = Image.new("RGB", (64, 64), "green")
    left = Image.new("RGBA", (64, 64), (0, 0, 0, 255))
    left.paste((0, 0, 0, 0), (0, 0, 32, 64))  # transparent: paint the left half
    right = Image.new("RGBA", (64, 64), (0, 0, 0, 255))
    right.paste((0, 0, 0, 0), (32, 0, 64, 64))
    [[plain]] = outputs(run(engine, job(input_image=source)))
    [[edit_left]] = outputs(run(engine, job(input_image=source, mask=left)))
    [[edit_right]] = outputs(run(engine, job(input_image=source, mask=right)))
    assert edit_left.size == (64, 64)
    assert len({digest(plain), digest(edit_left), digest(edit_right)}) == 3


def test_text_to_video_gives_the_frames_asked_for(engines):
    engine = engines[TEXT_TO_VIDEO]
    assert (engine.limits.max_frames, engine.limits.default_frames, engine.limits.takes_image) == (8, 8, False)
    events = run(engine, job(kind="video", num_frames=5, fps=8.0, width=48, height=64, partial_images=1))
    [frames] = outputs(events)
    assert len(frames) == 5 and {f.size for f in frames} == {(48, 64)}
    assert [e.partial_index for e in events if isinstance(e, Preview)] == [0]


def _counting_calls(module):
    calls: list[int] = []
    handle = module.register_forward_hook(lambda *_: calls.append(1))
    return calls, handle


def test_a_cancel_stops_the_denoising_loop_after_the_step_in_flight(engines):
    engine = engines[TEXT_TO_IMAGE]
    pipe = engine.pipelines.main
    unet_calls, unet_hook = _counting_calls(pipe.unet)
    decodes, vae_hook = _counting_calls(pipe.vae.decoder)
    cancelled = threading.Event()
    seen = []
    try:
        for event in engine.generate(job(steps=40, n=2), cancelled):
            seen.append(event)
            if isinstance(event, StepDone) and event.step == 3:
                cancelled.set()
                at_cancel = len(unet_calls)
    finally:
        unet_hook.remove()
        vae_hook.remove()
    assert not [e for e in seen if isinstance(e, Output)]
    assert [e.step for e in seen if isinstance(e, StepDone)] == [1, 2, 3]
    # The UNet ran at most the one step that was in flight when the cancel came, then nothing else:
    # no further step, no final VAE decode, no second output.
    assert len(unet_calls) <= at_cancel + 1 and len(unet_calls) <= 4
    assert decodes == []
    assert engine._job_lock.acquire(timeout=0), "the engine still holds the job after its generator ended"
    engine._job_lock.release()


def test_the_prompt_tokens_are_the_text_encoders_own_count(engines):
    engine = engines[TEXT_TO_IMAGE]
    # The byte-level tokenizer has no merges: one token per byte, plus <|startoftext|> and <|endoftext|>.
    assert engine.count_tokens("a red cat") == len("aredcat") + 2
    assert engine.count_tokens("word " * 200) == 77  # CLIP reads 77 tokens at most


# --- behind MediaService on a loopback port -------------------------------------------------------------


@pytest.fixture(scope="module")
async def media_workers(engines, tiny_dirs):
    """A real MediaService server per task, over the module's engines (the glue of services/workers/media)."""
    from services.workers.media.server import media_serving

    running = {}
    for task, engine in engines.items():
        serving = media_serving(_config(tiny_dirs / task, "--model-name", f"tiny-{task}").worker, engine)
        serving.server.grace_s = 0
        await serving.server.start()
        channel = grpc.aio.insecure_channel(serving.server.address, options=CHANNEL_OPTIONS)
        running[task] = (media_pb2_grpc.MediaServiceStub(channel), serving, channel)
    yield running
    for _, serving, channel in running.values():
        await channel.close()
        await serving.server.stop()


def request(**changes) -> media_pb2.GenerateMediaRequest:
    fields = dict(request_id="t", model="tiny", kind=media_pb2.MEDIA_KIND_IMAGE, prompt="a lighthouse at dusk",
                  width=64, height=64, n=1, num_inference_steps=2, seed=11, output_format="png")
    return media_pb2.GenerateMediaRequest(**{**fields, **changes})


async def collect(stub, req) -> tuple[dict[int, bytes], list, media_pb2.MediaDone]:
    data: dict[int, bytes] = {}
    others = []
    done = None
    async for event in stub.GenerateMedia(req, timeout=120):
        which = event.WhichOneof("event")
        if which == "chunk":
            data[event.chunk.index] = data.get(event.chunk.index, b"") + event.chunk.data
        elif which == "done":
            done = event.done
        else:
            others.append(event)
    assert done is not None
    return data, others, done


async def test_the_card_says_images_or_videos_with_limits_from_the_model(media_workers):
    image_card = media_workers[TEXT_TO_IMAGE][1].card
    video_card = media_workers[TEXT_TO_VIDEO][1].card
    assert image_card.kind == "diffusers" and image_card.model.endpoints == (IMAGES,)
    limits = image_card.model.media
    # The UNet's sample size (32) times the VAE's scale factor (2).
    assert (limits.default_width, limits.default_height, limits.max_width, limits.default_steps) == (64, 64, 128, 2)
    assert limits.takes_image and limits.output_formats == ("png", "jpeg", "webp")
    assert video_card.model.endpoints == (VIDEOS,) and video_card.model.media.output_formats == ("mp4", "mjpeg")


async def test_png_bytes_through_the_server_are_the_same_for_the_same_seed(media_workers):
    stub = media_workers[TEXT_TO_IMAGE][0]
    (a, _, done), (b, _, _), (c, _, _) = [await collect(stub, request(seed=s, width=48, height=32))
                                         for s in (11, 11, 12)]
    assert a[0] == b[0] and a[0] != c[0]
    image = Image.open(io.BytesIO(a[0]))
    assert image.format == "PNG" and image.size == (48, 32)
    assert done.content_type == "image/png" and done.input_tokens == len("alighthouseatdusk") + 2


async def test_jpeg_partial_images_and_progress_through_the_server(media_workers):
    stub = media_workers[TEXT_TO_IMAGE][0]
    data, others, _ = await collect(stub, request(output_format="jpeg", partial_images=2, n=2))
    assert sorted(data) == [0, 1] and all(Image.open(io.BytesIO(d)).format == "JPEG" for d in data.values())
    partials = [(e.partial.index, e.partial.partial_index) for e in others if e.WhichOneof("event") == "partial"]
    assert partials == [(0, 0), (0, 1), (1, 0), (1, 1)]
    progress = [e.progress.step for e in others if e.WhichOneof("event") == "progress"]
    assert progress == [1, 2, 3, 4]


async def test_image_to_image_through_the_server(media_workers):
    stub = media_workers[IMAGE_TO_IMAGE][0]
    buf = io.BytesIO()
    Image.new("RGB", (64, 64), "orange").save(buf, format="PNG")
    data, _, _ = await collect(stub, request(input_image=buf.getvalue(), width=32, height=48))
    assert Image.open(io.BytesIO(data[0])).size == (32, 48)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await collect(stub, request())
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "needs an input image" in e.value.details()


async def test_an_mp4_through_the_server_has_the_frames_and_fps_asked_for(media_workers):
    av = require_module("av")
    stub = media_workers[TEXT_TO_VIDEO][0]
    data, _, done = await collect(stub, request(kind=media_pb2.MEDIA_KIND_VIDEO, output_format="mp4",
                                                num_frames=6, fps=12.0))
    with av.open(io.BytesIO(data[0])) as container:
        stream = container.streams.video[0]
        frames = [f for f in container.decode(stream)]
        assert (len(frames), float(stream.average_rate), stream.width, stream.height) == (6, 12.0, 64, 64)
    assert (done.num_frames, done.fps, done.content_type) == (6, 12.0, "video/mp4")


async def test_a_caller_that_hangs_up_stops_the_step_loop_within_a_second(media_workers, engines):
    stub = media_workers[TEXT_TO_IMAGE][0]
    engine = engines[TEXT_TO_IMAGE]
    call = stub.GenerateMedia(request(num_inference_steps=100), timeout=120)  # ~0.05 s a step (0.3 under load)
    async for event in call:
        if event.WhichOneof("event") == "progress" and event.progress.step >= 2:
            break
    call.cancel()
    cancelled_at = time.monotonic()
    # The engine holds its job until the pipeline call has really returned.
    while not engine._job_lock.acquire(timeout=0):
        assert time.monotonic() - cancelled_at < 1.0, "the denoising loop still ran a second after the cancel"
        await asyncio.sleep(0.01)
    engine._job_lock.release()


# --- the command itself -----------------------------------------------------------------------------------


def _worker_process(*flags: str):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHFRONT_")}
    env["PYTHONPATH"] = ":".join(sys.path)
    return subprocess.Popen([sys.executable, "-m", "services.workers.diffusers", "--port", "0", "--no-register",
                             "--host", "127.0.0.1", "--threads", "1", *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


async def test_meshfront_diffusers_loads_a_model_dir_serves_it_and_stops_on_sigterm(tiny_dirs):
    import signal

    proc = _worker_process("--model-dir", str(tiny_dirs / TEXT_TO_VIDEO), "--default-steps", "2")
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 120)
        assert line.startswith("READY "), (line, proc.stderr.read() if proc.poll() is not None else "")
        address = line.split()[-1]
        async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
            stub = media_pb2_grpc.MediaServiceStub(channel)
            data, _, done = await collect(stub, request(kind=media_pb2.MEDIA_KIND_VIDEO, output_format="mjpeg",
                                                        num_frames=3, fps=4.0))
        assert (done.num_frames, done.content_type) == (3, "video/x-msvideo") and data[0][:4] == b"RIFF"
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 60)
    assert code == 0, proc.stderr.read()


async def test_a_directory_that_is_no_pipeline_fails_the_start_naming_it(tmp_path):
    from services.workers import entry
    from services.workers.diffusers.main import build
    from services.workers.server import EngineStartFailed

    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "tokenizer_config.json").write_text('{"model_max_length": 77}')
    with pytest.raises(EngineStartFailed, match=r"--model-dir .* is not a diffusers pipeline"):
        await build(_config(tmp_path), entry.KvEvents())
