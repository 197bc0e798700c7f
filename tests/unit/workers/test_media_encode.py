"""The media encoders: image formats and options, MP4 and MJPEG read back with PyAV (frame count, fps, size)."""

from __future__ import annotations

import io
import random
from fractions import Fraction

import av
import pytest
from PIL import Image

from services.workers.media.encode import OddVideoSize, content_type, encode_image, encode_video, fps_fraction

pytestmark = pytest.mark.unit


def frames(count: int, size: tuple[int, int] = (64, 48), seed: int = 0) -> list[Image.Image]:
    """Noise frames, each different: an encoder that dropped or merged one would show in the count."""
    rng = random.Random(seed)
    return [Image.frombytes("RGB", size, rng.randbytes(size[0] * size[1] * 3)) for _ in range(count)]


def read_video(data: bytes) -> tuple[int, Fraction, tuple[int, int], str, str]:
    """(decoded frames, average rate, size, codec, container) as a client with PyAV sees them."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        decoded = list(container.decode(video=0))
        size = (decoded[0].width, decoded[0].height)
        return len(decoded), Fraction(stream.average_rate), size, stream.codec_context.name, container.format.name


@pytest.mark.parametrize("fmt,pil", [("png", "PNG"), ("jpeg", "JPEG"), ("webp", "WEBP")])
@pytest.mark.parametrize("size", [(64, 64), (96, 40)])
def test_images_keep_their_size_in_each_format(fmt, pil, size):
    data = encode_image(frames(1, size)[0], fmt)
    image = Image.open(io.BytesIO(data))
    assert image.format == pil and image.size == size
    assert content_type(fmt) == f"image/{fmt}"


def test_output_compression_is_the_jpeg_and_webp_quality():
    image = frames(1, (128, 128))[0]
    for fmt in ("jpeg", "webp"):
        assert len(encode_image(image, fmt, quality=10)) < len(encode_image(image, fmt, quality=95))


def test_transparent_keeps_the_alpha_and_opaque_drops_it():
    image = Image.new("RGBA", (32, 32), (10, 200, 30, 0))
    image.paste((255, 0, 0, 255), (8, 8, 24, 24))
    for fmt in ("png", "webp"):
        kept = Image.open(io.BytesIO(encode_image(image, fmt, transparent=True)))
        assert kept.mode == "RGBA" and kept.getpixel((0, 0))[3] == 0 and kept.getpixel((16, 16))[3] == 255
        opaque = Image.open(io.BytesIO(encode_image(image, fmt)))
        assert opaque.mode == "RGB" and opaque.getpixel((0, 0))[1] > 150  # the straight colour shows
    # JPEG has no alpha: the image is flattened whatever was asked.
    assert Image.open(io.BytesIO(encode_image(image, "jpeg", transparent=True))).mode == "RGB"


@pytest.mark.parametrize("fps", [8.0, 24.0, 7.5, 24000 / 1001])
def test_mp4_has_exactly_the_frames_and_the_rate(fps):
    count, rate, size, codec, container = read_video(encode_video(frames(17), "mp4", fps))
    assert (count, size, codec) == (17, (64, 48), "h264")
    assert "mp4" in container
    assert rate == fps_fraction(fps) and abs(float(rate) - fps) < 1e-3


def test_mp4_puts_its_index_first_so_playback_starts_before_the_end():
    data = encode_video(frames(4), "mp4", 8)
    assert data.index(b"moov") < data.index(b"mdat")


def test_a_float32_fps_from_the_proto_is_read_back_exactly():
    import numpy as np

    fps = float(np.float32(23.976))  # what a proto float carries
    assert fps_fraction(fps) == Fraction(2997, 125)


def test_mjpeg_is_an_avi_whose_every_frame_decodes():
    data = encode_video(frames(12, (65, 49)), "mjpeg", 12.0)
    count, rate, size, codec, container = read_video(data)
    assert (count, rate, size, codec, container) == (12, Fraction(12), (65, 49), "mjpeg", "avi")
    assert content_type("mjpeg") == "video/x-msvideo"


def test_mjpeg_quality_follows_output_compression():
    clip = frames(4, (96, 96))
    assert len(encode_video(clip, "mjpeg", 8, quality=10)) < len(encode_video(clip, "mjpeg", 8, quality=95))


def test_odd_sizes_are_refused_for_mp4_not_padded():
    with pytest.raises(OddVideoSize, match="even width and height, not 65x48"):
        encode_video(frames(2, (65, 48)), "mp4", 8)


def test_frames_of_different_sizes_or_none_are_a_bug_of_the_engine():
    with pytest.raises(ValueError, match="same size"):
        encode_video([*frames(1, (64, 48)), *frames(1, (32, 32))], "mp4", 8)
    with pytest.raises(ValueError, match="at least one frame"):
        encode_video([], "mp4", 8)


@pytest.mark.parametrize("size", [(32, 32), (48, 32), (64, 48), (96, 64), (160, 128)])
def test_an_mp4_is_the_same_bytes_every_time(size):
    """The same frames give the same MP4, encode after encode, with others running beside them: at these sizes
    x264's macroblock tree gave other bytes one encode in twenty or so (encode.py turns it off)."""
    import hashlib
    from concurrent.futures import ThreadPoolExecutor

    base = Image.linear_gradient("L").resize(size).convert("RGB")
    moving = [base.rotate(7 * i, translate=(i, i // 2)) for i in range(16)]
    with ThreadPoolExecutor(3) as pool:
        digests = set(pool.map(lambda _: hashlib.sha256(encode_video(moving, "mp4", 10.0)).digest(), range(40)))
    assert len(digests) == 1
