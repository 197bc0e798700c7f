"""Proving media are what their part says, and measuring them: Pillow for images, PyAV for video and audio.

Runs on a worker thread (``resolve.py``): decoding is CPU work the event loop must not wait on.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import io
import re
import warnings

import av
from PIL import Image, UnidentifiedImageError

from services.common import audio_samples, video_frames

# A decoded frame larger than this is refused before its pixels are decoded (a decompression bomb is a
# small file that decodes to gigabytes). ~8k x 8k.
MAX_PIXELS = 64 * 1024 * 1024
# The frames a worker decodes from one video (services/common/video_frames.py) are held as RGB pixels until
# the engine resizes them: a long high-resolution clip is refused rather than exhausting a worker's memory.
MAX_SAMPLED_VIDEO_BYTES = 1024 * 1024 * 1024
_DATA_URL = re.compile(r"^data:([A-Za-z0-9.+-]+/[A-Za-z0-9.+-]+)(?:;[A-Za-z0-9=.+-]+)*;base64,(.*)$", re.DOTALL)
AUDIO_MIME = {"wav": "audio/wav", "mp3": "audio/mpeg"}
_VIDEO_MIME = {"mov,mp4,m4a,3gp,3g2,mj2": "video/mp4", "matroska,webm": "video/webm", "avi": "video/x-msvideo"}


class DecodeRefused(Exception):
    """The bytes are not acceptable media; the message says why."""


@dataclasses.dataclass(frozen=True)
class Decoded:
    mime_type: str
    width: int = 0
    height: int = 0
    # Video: frames in the stream and its duration in seconds (0 when the container does not say).
    frames: int = 0
    duration_s: float = 0.0
    # Audio: its samples at services/preprocessor/media/audio.py's SAMPLING_RATE, mono.
    samples: int = 0


def data_url_payload(url: str, max_bytes: int) -> bytes:
    """The bytes of a base64 data URL, refusing one whose payload exceeds ``max_bytes`` before decoding it."""
    m = _DATA_URL.match(url)
    if m is None:
        raise DecodeRefused("it is not a base64 data URL")
    return base64_payload(m.group(2), max_bytes)


def base64_payload(payload: str, max_bytes: int) -> bytes:
    if len(payload) // 4 * 3 > max_bytes + 3:  # the decoded size, to within padding, without decoding
        raise DecodeRefused(f"its data is larger than the {max_bytes}-byte limit")
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise DecodeRefused("its data is not valid base64") from None
    if len(raw) > max_bytes:
        raise DecodeRefused(f"its data is {len(raw)} bytes; the limit is {max_bytes}")
    if not raw:
        raise DecodeRefused("its data is empty")
    return raw


def decode_image(raw: bytes) -> Decoded:
    """Decodes every pixel (a header alone proves little); refuses what Pillow cannot read."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(raw)) as img:
                width, height = img.size
                if width * height > MAX_PIXELS:
                    raise DecodeRefused(f"the image is {width}x{height} pixels; the limit is {MAX_PIXELS} pixels")
                fmt = img.format or ""
                img.load()
    except DecodeRefused:
        raise
    except (UnidentifiedImageError, Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise DecodeRefused("it is not an image this service can decode") from None
    except (OSError, SyntaxError, ValueError, EOFError):
        raise DecodeRefused("it is not a complete, valid image") from None
    if width <= 0 or height <= 0:
        raise DecodeRefused("the image has no pixels")
    return Decoded(Image.MIME.get(fmt, f"image/{fmt.lower()}"), width, height)


def decode_video(raw: bytes) -> Decoded:
    """Opens the container, finds a video stream, decodes its first frame and counts its frames
    (services/common/video_frames.py: the count the vLLM worker samples frames by)."""
    try:
        with av.open(io.BytesIO(raw), mode="r") as container:
            # FFmpeg reads a still image (PNG, JPEG) as a one-frame "video"; a video part must be a video.
            if container.format.name == "image2" or container.format.name.endswith("_pipe"):
                raise DecodeRefused("it is a still image, not a video")
            if not container.streams.video:
                raise DecodeRefused("it has no video stream")
            stream = container.streams.video[0]
            first = next(container.decode(stream), None)
            if first is None:
                raise DecodeRefused("its video stream has no frames")
            width, height = first.width, first.height
            if width * height > MAX_PIXELS:
                raise DecodeRefused(f"its frames are {width}x{height} pixels; the limit is {MAX_PIXELS} pixels")
            mime = _VIDEO_MIME.get(container.format.name, f"video/{container.format.name.split(',')[0]}")
        with av.open(io.BytesIO(raw), mode="r") as container:
            frames, duration = video_frames.measure(container)
    except DecodeRefused:
        raise
    except (av.FFmpegError, StopIteration, ValueError, OSError):
        raise DecodeRefused("it is not a video this service can decode") from None
    sampled = video_frames.sampled_count(max(1, frames), duration)
    if sampled * width * height * 3 > MAX_SAMPLED_VIDEO_BYTES:
        raise DecodeRefused(f"its {sampled} sampled frames of {width}x{height} pixels come to more than "
                            f"{MAX_SAMPLED_VIDEO_BYTES} bytes decoded; send a shorter or smaller video")
    return Decoded(mime, width, height, frames=max(1, frames), duration_s=duration)


def decode_audio(raw: bytes, fmt: str, rate: int, max_seconds: float) -> Decoded:
    """Decodes the whole clip at ``rate`` Hz mono (services/common/audio_samples.py, as the vLLM worker will) to
    count its samples; refuses what is not ``fmt`` audio or is longer than ``max_seconds``."""
    try:
        samples = audio_samples.decode(raw, fmt, rate, max_seconds)
    except audio_samples.AudioRefused as e:
        raise DecodeRefused(str(e)) from None
    return Decoded(AUDIO_MIME[fmt], duration_s=len(samples) / rate, samples=len(samples))
