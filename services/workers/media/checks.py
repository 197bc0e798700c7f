"""A GenerateMediaRequest checked against the engine's limits and decoded into a ``MediaJob``.

The gateway checks the same limits before routing (its 400s name the client's fields); the worker
checks again because it must not trust its caller: anything reaching the engine is within what its
card advertises. proto3 cannot tell an unset number from 0, so 0 means the model's default for the
size, steps, n, frames and fps, as the gateway would have filled it. Pure: no gRPC, no asyncio.
"""

from __future__ import annotations

import io
import re
import warnings
from typing import Literal

from meshfront.worker.v1 import media_pb2
from PIL import Image, UnidentifiedImageError

from services.common.discovery import MediaLimits
from services.common.errors import InvalidRequest
from services.workers.media.encode import IMAGE_CONTENT_TYPES, VIDEO_CONTENT_TYPES
from services.workers.media.engine import MediaJob

MAX_PARTIAL_IMAGES = 3
MAX_FPS = 240.0
BACKGROUNDS = ("", "auto", "opaque", "transparent")
QUALITIES = ("", "auto", "low", "medium", "high")
# An uploaded image may be larger than the outputs (it is resized by the engine), within reason: a
# decompression bomb (a tiny PNG of 50 000 x 50 000 pixels) is refused from its header, before decoding.
MAX_INPUT_PIXELS = 64 << 20
INPUT_FORMATS = ("PNG", "JPEG", "WEBP")
KINDS = {media_pb2.MEDIA_KIND_IMAGE: "image", media_pb2.MEDIA_KIND_VIDEO: "video"}


def engine_kind(limits: MediaLimits) -> Literal["image", "video"]:
    """A video model advertises frames; an image model none."""
    return "video" if limits.max_frames > 0 else "image"


def check_request(req: media_pb2.GenerateMediaRequest, limits: MediaLimits) -> None:
    """Raises InvalidRequest naming the first field outside ``limits``."""
    kind = KINDS.get(req.kind)
    if kind is None:
        raise InvalidRequest("kind must be image or video", param="kind")
    own = engine_kind(limits)
    if kind != own:
        raise InvalidRequest(f"The model `{req.model}` generates {own}s, not {kind}s", param="model")
    width, height = req.width or limits.default_width, req.height or limits.default_height
    _check_sizes(req, limits, width, height)
    _check_encoding(req, limits, kind)
    if (req.input_image or req.mask) and not limits.takes_image:
        raise InvalidRequest(f"The model `{req.model}` does not take an input image", param="input_image")
    if req.mask and not req.input_image:
        raise InvalidRequest("a mask needs the image it masks", param="mask")
    if kind == "video":
        _check_video(req, limits, width, height)
    elif req.num_frames or req.fps:
        raise InvalidRequest("num_frames and fps are for videos", param="num_frames" if req.num_frames else "fps")


def _check_sizes(req: media_pb2.GenerateMediaRequest, limits: MediaLimits, width: int, height: int) -> None:
    if width > limits.max_width or height > limits.max_height:
        raise InvalidRequest(f"size {width}x{height} is larger than this model's largest, "
                             f"{limits.max_width}x{limits.max_height}", param="size")
    m = limits.size_multiple
    if width % m or height % m:
        raise InvalidRequest(f"size {width}x{height}: width and height must be multiples of {m}", param="size")
    n = req.n or 1
    if n > limits.max_n:
        raise InvalidRequest(f"n must be between 1 and {limits.max_n}, got {n}", param="n")
    steps = req.num_inference_steps or limits.default_steps
    if steps > limits.max_steps:
        raise InvalidRequest(f"num_inference_steps must be between 1 and {limits.max_steps}, got {steps}",
                             param="num_inference_steps")
    if req.partial_images > MAX_PARTIAL_IMAGES:
        raise InvalidRequest(f"partial_images must be between 0 and {MAX_PARTIAL_IMAGES}, got {req.partial_images}",
                             param="partial_images")
    if req.HasField("guidance_scale") and not 0 <= req.guidance_scale <= 100:
        raise InvalidRequest(f"guidance_scale must be between 0 and 100, got {req.guidance_scale}",
                             param="guidance_scale")


def _check_encoding(req: media_pb2.GenerateMediaRequest, limits: MediaLimits, kind: str) -> None:
    formats = IMAGE_CONTENT_TYPES if kind == "image" else VIDEO_CONTENT_TYPES
    if req.output_format not in formats or req.output_format not in limits.output_formats:
        allowed = [f for f in limits.output_formats if f in formats]
        raise InvalidRequest(f"output_format must be one of {', '.join(allowed)}, got {req.output_format!r}",
                             param="output_format")
    if req.HasField("output_compression") and req.output_compression > 100:
        raise InvalidRequest(f"output_compression must be between 0 and 100, got {req.output_compression}",
                             param="output_compression")
    if req.background not in BACKGROUNDS:
        raise InvalidRequest(f"background must be transparent, opaque or auto, got {req.background!r}",
                             param="background")
    if req.background == "transparent" and req.output_format not in ("png", "webp"):
        raise InvalidRequest("a transparent background needs output_format png or webp", param="background")
    if req.quality not in QUALITIES:
        raise InvalidRequest(f"quality must be low, medium, high or auto, got {req.quality!r}", param="quality")


def _check_video(req: media_pb2.GenerateMediaRequest, limits: MediaLimits, width: int, height: int) -> None:
    frames = req.num_frames or limits.default_frames
    if frames > limits.max_frames:
        raise InvalidRequest(f"num_frames must be between 1 and {limits.max_frames}, got {frames}",
                             param="num_frames")
    fps = req.fps or limits.default_fps
    if not 0 < fps <= MAX_FPS:  # NaN fails this too
        raise InvalidRequest(f"fps must be above 0 and at most {MAX_FPS:g}, got {fps}", param="fps")
    if req.output_format == "mp4" and (width % 2 or height % 2):
        raise InvalidRequest(f"size {width}x{height}: an mp4 (H.264) needs an even width and height",
                             param="size")


def decode_image(data: bytes, field: str) -> Image.Image:
    """An uploaded PNG, JPEG or WebP, fully decoded (blocking: call it off the event loop)."""
    too_big = InvalidRequest(f"{field} has more pixels than this worker decodes (at most {MAX_INPUT_PIXELS})",
                             param=field)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=INPUT_FORMATS)
            if image.width * image.height > MAX_INPUT_PIXELS:
                raise too_big
            image.load()
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as e:
        raise too_big from e
    except UnidentifiedImageError as e:
        raise InvalidRequest(f"{field} is not a valid PNG, JPEG or WebP image", param=field) from e
    except (OSError, ValueError, SyntaxError) as e:  # a known format whose data is broken (truncated, ...)
        raise InvalidRequest(f"{field} is not a valid PNG, JPEG or WebP image ({_reason(e)})", param=field) from e
    return image


def _reason(e: BaseException) -> str:
    # Pillow's messages name the problem ("image file is truncated"); drop any object repr it quotes.
    return re.sub(r"\s*<[^>]*object at 0x[0-9a-f]+>", "", str(e))[:200] or type(e).__name__


def _has_alpha(image: Image.Image) -> bool:
    return "A" in image.getbands() or "transparency" in image.info


def build_job(req: media_pb2.GenerateMediaRequest, limits: MediaLimits) -> MediaJob:
    """The engine's job for a checked request; decodes the input image and mask (blocking)."""
    kind = engine_kind(limits)
    image = mask = None
    if req.input_image:
        image = decode_image(req.input_image, "input_image")
        image = image.convert("RGBA" if _has_alpha(image) else "RGB")  # palette, greyscale, CMYK: one of two
    if req.mask:
        if image is None:
            raise InvalidRequest("a mask needs the image it masks", param="mask")
        mask = decode_image(req.mask, "mask")
        if not _has_alpha(mask):
            raise InvalidRequest("mask must have an alpha channel (transparent where to edit)", param="mask")
        mask = mask.convert("RGBA")
        if mask.size != image.size:
            raise InvalidRequest(f"mask is {mask.width}x{mask.height} but the image {image.width}x{image.height}; "
                                 "they must be the same size", param="mask")
    video = kind == "video"
    return MediaJob(kind=kind, prompt=req.prompt, negative_prompt=req.negative_prompt,
                    width=req.width or limits.default_width, height=req.height or limits.default_height,
                    n=req.n or 1, steps=req.num_inference_steps or limits.default_steps,
                    guidance_scale=req.guidance_scale if req.HasField("guidance_scale") else None,
                    seed=req.seed, input_image=image, mask=mask,
                    num_frames=(req.num_frames or limits.default_frames) if video else 0,
                    fps=(req.fps or limits.default_fps) if video else 0.0, partial_images=req.partial_images)
