"""The mocker's media simulator (its engine and flags) and the media glue's request checks, without gRPC."""

from __future__ import annotations

import io
import threading

import pytest
from meshfront.worker.v1 import media_pb2
from PIL import Image, ImageChops

from services.common.errors import InvalidRequest
from services.workers.config import ConfigError
from services.workers.media.checks import build_job, check_request, decode_image
from services.workers.media.engine import MediaJob, Output, Preview, StepDone
from services.workers.mocker.config import parse_config
from services.workers.mocker.media_engine import SimulatedMediaEngine, preview_steps

pytestmark = pytest.mark.unit

IMAGE, VIDEO = media_pb2.MEDIA_KIND_IMAGE, media_pb2.MEDIA_KIND_VIDEO


def simulator(kind: str = "image", *flags: str) -> SimulatedMediaEngine:
    cfg = parse_config(["--media", kind, "--model-name", f"demo-{kind}", "--media-step-ms", "0", *flags], env={})
    assert cfg.media is not None
    return SimulatedMediaEngine(cfg.media)


def job(**kw) -> MediaJob:
    base = dict(kind="image", prompt="a red fox", negative_prompt="", width=64, height=48, n=1, steps=4,
                guidance_scale=None, seed=7, input_image=None, mask=None, num_frames=0, fps=0.0, partial_images=0)
    return MediaJob(**{**base, **kw})


def outputs(engine: SimulatedMediaEngine, j: MediaJob) -> list[Output]:
    return [e for e in engine.generate(j, threading.Event()) if isinstance(e, Output)]


def png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


def test_the_same_job_draws_the_same_pixels_and_another_seed_or_prompt_others():
    engine = simulator()
    [a] = outputs(engine, job())
    [b] = outputs(engine, job())
    assert png(a.frames[0]) == png(b.frames[0])
    for other in (job(seed=8), job(prompt="a blue fox"), job(negative_prompt="blurry")):
        [c] = outputs(engine, other)
        assert png(c.frames[0]) != png(a.frames[0])


def test_output_i_is_drawn_from_seed_plus_i():
    engine = simulator()
    three = outputs(engine, job(n=3))
    assert [o.index for o in three] == [0, 1, 2]
    assert len({png(o.frames[0]) for o in three}) == 3
    [second] = outputs(engine, job(seed=8))
    assert png(second.frames[0]) == png(three[1].frames[0])


def test_steps_are_counted_across_outputs_and_previews_come_evenly_spaced():
    assert preview_steps(10, 3) == [2, 5, 7] and preview_steps(2, 3) == [1, 1, 1] and preview_steps(5, 0) == []
    events = list(simulator().generate(job(n=2, steps=10, partial_images=3), threading.Event()))
    steps = [e.step for e in events if isinstance(e, StepDone)]
    assert steps == list(range(1, 21)) and {e.total_steps for e in events if isinstance(e, StepDone)} == {20}
    previews = [(e.index, e.partial_index) for e in events if isinstance(e, Preview)]
    assert previews == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    # Each preview comes after its step and before its output.
    order = [type(e).__name__ for e in events][:12]
    assert order[:3] == ["StepDone", "StepDone", "Preview"] and "Output" in [type(e).__name__ for e in events[20:]]


def test_a_video_has_its_frames_and_they_change_over_time():
    engine = simulator("video")
    [out] = outputs(engine, job(kind="video", num_frames=6, fps=8.0))
    assert len(out.frames) == 6 and {f.size for f in out.frames} == {(64, 48)}
    assert len({png(f) for f in out.frames}) == 6


def test_image_to_image_derives_from_the_input_and_a_mask_keeps_what_is_opaque():
    engine = simulator()
    source = Image.new("RGB", (64, 48), (0, 128, 255))
    mask = Image.new("RGBA", (64, 48), (0, 0, 0, 255))
    mask.paste((0, 0, 0, 0), (0, 0, 32, 48))  # paint the left half
    [plain] = outputs(engine, job())
    [derived] = outputs(engine, job(input_image=source))
    [edited] = outputs(engine, job(input_image=source, mask=mask))
    assert png(derived.frames[0]) != png(plain.frames[0])
    right = (32, 0, 64, 48)
    assert ImageChops.difference(edited.frames[0].crop(right), source.crop(right)).getbbox() is None
    assert ImageChops.difference(edited.frames[0].crop((0, 0, 32, 48)), source.crop((0, 0, 32, 48))).getbbox()


def test_a_cancel_between_steps_ends_the_job_without_its_output():
    engine = simulator()
    cancelled = threading.Event()
    seen = []
    for event in engine.generate(job(steps=50), cancelled):
        seen.append(event)
        if len(seen) == 3:
            cancelled.set()
    assert len(seen) == 3 and engine.steps_taken == 3


def test_count_tokens_counts_words_and_marks():
    assert simulator().count_tokens("a cat, sitting.") == 5


def test_the_flags_set_the_limits_the_card_advertises():
    limits = simulator("video", "--media-max-size", "640x640", "--media-default-size", "320x240",
                       "--media-max-frames", "50", "--media-formats", "mp4").limits
    assert (limits.max_width, limits.max_height, limits.default_width, limits.default_height) == (640, 640, 320, 240)
    assert limits.max_frames == 50 and limits.output_formats == ("mp4",) and limits.default_fps == 8.0
    image = simulator().limits
    assert image.max_frames == 0 and image.output_formats == ("png", "jpeg", "webp") and image.takes_image


@pytest.mark.parametrize("flags,message", [
    (["--media", "image", "--media-formats", "mp4"], "--media-formats"),
    (["--media", "video", "--media-default-size", "321x240"], "multiple of --media-size-multiple"),
    (["--media", "image", "--media-max-size", "big"], "--media-max-size must be WIDTHxHEIGHT"),
    (["--media", "image", "--media-default-steps", "200"], "--media-default-steps"),
    (["--media", "image", "--max-running-jobs", "0"], "--max-running-jobs"),
    (["--media", "image"], "--model-name is required without --model-dir"),
])
def test_bad_media_flags_are_refused_naming_them(flags, message):
    with pytest.raises(ConfigError, match=message):
        parse_config([*flags, *([] if "--model-name" in message else ["--model-name", "m"])], env={})


def test_a_text_mocker_still_needs_its_model_directory():
    with pytest.raises(ConfigError, match="--model-dir is required"):
        parse_config(["--model-name", "m"], env={})


def request(**kw) -> media_pb2.GenerateMediaRequest:
    return media_pb2.GenerateMediaRequest(**{"kind": IMAGE, "prompt": "p", "output_format": "png", **kw})


@pytest.mark.parametrize("kw,param", [
    (dict(kind=VIDEO, output_format="mp4"), "model"),
    (dict(kind=0), "kind"),
    (dict(width=4096, height=64), "size"),
    (dict(width=100, height=64), "size"),
    (dict(n=11), "n"),
    (dict(num_inference_steps=101), "num_inference_steps"),
    (dict(output_format="gif"), "output_format"),
    (dict(output_format="mp4"), "output_format"),
    (dict(output_compression=101), "output_compression"),
    (dict(partial_images=4), "partial_images"),
    (dict(background="transparent", output_format="jpeg"), "background"),
    (dict(background="purple"), "background"),
    (dict(quality="ultra"), "quality"),
    (dict(num_frames=4), "num_frames"),
    (dict(mask=b"x"), "mask"),
])
def test_a_request_outside_the_image_models_limits_names_the_field(kw, param):
    with pytest.raises(InvalidRequest) as e:
        check_request(request(**kw), simulator().limits)
    assert e.value.param == param


@pytest.mark.parametrize("kw,param", [
    (dict(num_frames=121), "num_frames"),
    (dict(fps=1000.0), "fps"),
    (dict(width=322, height=240, output_format="mp4", size_multiple=2), "size"),
])
def test_a_request_outside_the_video_models_limits_names_the_field(kw, param):
    flags = ["--media-size-multiple", "1"] if kw.pop("size_multiple", None) else []
    kw = {"width": 320, "height": 240, "output_format": "mjpeg", **kw}
    if param == "size":
        kw["width"] = 321
    with pytest.raises(InvalidRequest) as e:
        check_request(request(kind=VIDEO, **kw), simulator("video", *flags).limits)
    assert e.value.param == param


def test_zero_means_the_models_default_as_the_gateway_would_fill_it():
    limits = simulator("video").limits
    req = request(kind=VIDEO, output_format="mp4")
    check_request(req, limits)
    j = build_job(req, limits)
    assert (j.width, j.height, j.n, j.steps, j.num_frames, j.fps) == (1280, 720, 1, 20, 32, 8.0)


def test_bad_image_bytes_are_an_invalid_request_naming_the_field():
    for data in (b"not an image", png(Image.new("RGB", (8, 8)))[:40], b"GIF89a" + bytes(40)):
        with pytest.raises(InvalidRequest, match="input_image is not a valid PNG, JPEG or WebP image") as e:
            decode_image(data, "input_image")
        assert e.value.param == "input_image" and "object at" not in e.value.message


def test_a_decompression_bomb_is_refused_from_its_header():
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    # Past Pillow's own bomb limit, and past ours (64 Mi pixels) but under Pillow's.
    for width, height in ((50_000, 50_000), (10_000, 7_000)):
        header = chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        bomb = b"\x89PNG\r\n\x1a\n" + header + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")
        with pytest.raises(InvalidRequest, match="input_image has more pixels than this worker decodes"):
            decode_image(bomb, "input_image")


def test_a_mask_must_have_alpha_and_the_images_size():
    limits = simulator().limits
    source = png(Image.new("RGB", (16, 16)))
    with pytest.raises(InvalidRequest, match="alpha channel"):
        build_job(request(input_image=source, mask=png(Image.new("RGB", (16, 16)))), limits)
    with pytest.raises(InvalidRequest, match="mask is 8x8 but the image 16x16"):
        build_job(request(input_image=source, mask=png(Image.new("RGBA", (8, 8)))), limits)
