"""Encodes what a media engine made into the client's bytes: PNG, JPEG, WebP images; MP4, MJPEG videos.

Pure and blocking (Pillow, PyAV): the glue (service.py) calls these in a thread, never on the event loop.

Choices a client sees (docs/media.md, "Encoding"):

- Images: ``output_compression`` is the JPEG/WebP quality (0-100; Pillow's default 75 when unset) and is
  ignored for PNG, which is lossless. ``transparent`` keeps an image's alpha channel (PNG and WebP);
  otherwise the alpha is dropped, so an engine may render straight-alpha RGBA (colour everywhere,
  alpha 0 behind its subject) and the one image serves both an opaque and a transparent request.
  An engine that renders RGB has no transparency to give: its image stays opaque.
- MP4: H.264 (libx264) in yuv420p, playable everywhere; ``moov`` first (faststart) so that a player
  can start before the whole file arrived. 4:2:0 halves the colour planes, so H.264 refuses odd sizes:
  an odd width or height is refused (``OddVideoSize``, a 400 in the glue) rather than silently
  padded or cropped into a size the client did not ask for.
- MJPEG: the JPEG frames in an AVI container (``video/x-msvideo``). A raw MJPEG stream has no frame
  rate and a multipart one (``multipart/x-mixed-replace``) none either, so neither could say ``fps``;
  AVI carries the rate and the frame count in its header and PyAV/FFmpeg (and every desktop player)
  decode every frame of it. Any size is accepted.
- ``fps`` is written as an exact rational (23.976 becomes 2997/125, 24000/1001-style rates stay
  exact within 1/1001) with one timestamp per frame, so the decoded frame count is ``num_frames``
  and the stream's rate is ``fps``.
"""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Sequence
from fractions import Fraction

from PIL import Image

IMAGE_CONTENT_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}
VIDEO_CONTENT_TYPES = {"mp4": "video/mp4", "mjpeg": "video/x-msvideo"}
CONTENT_TYPES = {**IMAGE_CONTENT_TYPES, **VIDEO_CONTENT_TYPES}
# Denominator bound for a float fps: keeps NTSC rates (24000/1001) exact and a float32's noise out.
_FPS_DENOMINATOR = 1001


class OddVideoSize(ValueError):
    """H.264 in yuv420p needs even sizes."""


def content_type(output_format: str) -> str:
    return CONTENT_TYPES[output_format]


def encode_image(image: Image.Image, output_format: str, *, quality: int | None = None,
                 transparent: bool = False) -> bytes:
    """One image as png | jpeg | webp bytes."""
    if output_format not in IMAGE_CONTENT_TYPES:
        raise ValueError(f"not an image format: {output_format!r}")
    keep_alpha = transparent and output_format in ("png", "webp")
    image = _rgba_or_rgb(image, keep_alpha)
    buf = io.BytesIO()
    if output_format == "png":
        image.save(buf, "PNG")
    elif output_format == "jpeg":
        image.save(buf, "JPEG", **({} if quality is None else {"quality": quality}))
    else:
        image.save(buf, "WEBP", **({} if quality is None else {"quality": quality}))
    return buf.getvalue()


def _rgba_or_rgb(image: Image.Image, keep_alpha: bool) -> Image.Image:
    has_alpha = "A" in image.getbands() or "transparency" in image.info
    if keep_alpha and has_alpha:
        return image if image.mode == "RGBA" else image.convert("RGBA")
    return image if image.mode == "RGB" else image.convert("RGB")


def fps_fraction(fps: float) -> Fraction:
    if fps <= 0:
        raise ValueError(f"fps must be positive, not {fps}")
    return Fraction(fps).limit_denominator(_FPS_DENOMINATOR)


def encode_video(frames: Sequence[Image.Image], output_format: str, fps: float, *,
                 quality: int | None = None) -> bytes:
    """Frames (all one size) as an mp4 (H.264) or mjpeg (AVI) file of exactly ``len(frames)`` frames."""
    if not frames:
        raise ValueError("a video needs at least one frame")
    width, height = frames[0].size
    if any(f.size != (width, height) for f in frames):
        raise ValueError("every frame of a video must have the same size")
    if output_format == "mp4":
        if width % 2 or height % 2:
            raise OddVideoSize(f"mp4 (H.264, yuv420p) needs an even width and height, not {width}x{height}")
        container_format, codec, pix_fmt = "mp4", "libx264", "yuv420p"
        container_options: dict[str, str] = {"movflags": "+faststart"}
    elif output_format == "mjpeg":
        # yuvj420p: full-range JPEG colour, what FFmpeg's mjpeg encoder takes; JPEG pads odd sizes itself.
        container_format, codec, pix_fmt = "avi", "mjpeg", "yuvj420p"
        container_options = {}
    else:
        raise ValueError(f"not a video format: {output_format!r}")
    with tempfile.TemporaryDirectory(prefix="meshfront-encode-") as tmp:
        # A file, not a BytesIO: faststart rewrites the file in a second pass, which FFmpeg does by
        # reopening it by name.
        path = os.path.join(tmp, f"out.{container_format}")
        _write_video(path, frames, container_format, container_options, codec, pix_fmt, fps, quality)
        with open(path, "rb") as f:
            return f.read()


def _write_video(path: str, frames: Sequence[Image.Image], container_format: str, container_options: dict[str, str],
                 codec: str, pix_fmt: str, fps: float, quality: int | None) -> None:
    import av  # FFmpeg's libraries take ~130 ms to load: only a video needs them, not every worker that imports this

    width, height = frames[0].size
    with av.open(path, "w", format=container_format, options=container_options) as container:
        stream = container.add_stream(codec, rate=fps_fraction(fps))
        assert isinstance(stream, av.VideoStream)  # for the type checker: a video codec makes a video stream
        stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
        if codec == "libx264":
            # No macroblock tree: x264's MB-tree reads memory it never wrote (with MALLOC_PERTURB_ set the bytes
            # are stable), so the same frames gave other bytes now and then, threads or none, and a seed must give
            # the same bytes (tests/unit/workers/test_media_encode.py fails without this). CRF 28 without it
            # matches x264's default (CRF 23 with it) in PSNR on the mocker's scenes at 320x240 and 640x480, for
            # ~13 % more bytes: what MB-tree bought.
            stream.codec_context.options = {"x264-params": "mbtree=0", "crf": "28"}
        if quality is not None and codec == "mjpeg":
            # JPEG quality 0-100 onto FFmpeg's qscale 31 (worst) .. 2 (best).
            q = round(31 - (max(0, min(100, quality)) / 100) * 29)
            stream.codec_context.qmin = stream.codec_context.qmax = q
        for i, image in enumerate(frames):
            frame = av.VideoFrame.from_image(image if image.mode == "RGB" else image.convert("RGB"))
            frame.pts = i  # one tick of 1/fps per frame: the count and the rate are exact
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
