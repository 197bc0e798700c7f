"""The Images API request, validated: every field read, every unknown field a 400 naming it.

OpenAI's fields (https://platform.openai.com/docs/api-reference/images): ``model``, ``prompt``, ``n``
(1-10, and at most the model's ``max_n``), ``size`` (``WxH`` or ``auto``: the model's default, or an
edit's input size), ``response_format`` (``b64_json``, the default, or ``url``), ``output_format``
(png | jpeg | webp, as the model encodes), ``output_compression`` (0-100, jpeg and webp only),
``quality`` and ``background`` (passed to the worker; ``transparent`` needs png or webp), ``stream``
with ``partial_images`` (0-3); ``user``, ``safety_identifier`` and ``moderation`` are accepted for
compatibility (the mesh runs no moderation). Dynamo's extensions: ``nvext`` (``negative_prompt``,
``num_inference_steps``, ``guidance_scale``, ``seed``) and the top-level ``input_reference`` (a
base64 image or a ``data:`` URL) for image-to-image.

The prompt, the inline image, the size and the checks against the model's limits that the Videos API makes
too are services/gateway/media/request_fields.py's.

Generations come as JSON; edits as multipart/form-data (``image`` or repeated ``image[]``, ``mask``),
whose text fields are read here as the JSON ones are (numbers and booleans from their text; ``nvext`` as
the nested fields ``nvext[seed]``, ... that the openai SDK sends for ``extra_body``, or as one JSON text).
Checks against the model's limits (``MediaLimits``) are ``resolve``'s.
"""

from __future__ import annotations

import dataclasses
import io
import secrets
from typing import Any

import orjson
from meshfront.worker.v1 import media_pb2
from PIL import Image, UnidentifiedImageError

from services.common.discovery import MediaLimits
from services.common.errors import InvalidRequest
from services.gateway.core.fields import UINT32, UINT64, Fields
from services.gateway.core.request import load_json
from services.gateway.media import request_fields
from services.gateway.media.multipart import Form, FormFields, parse_form, text_object

RESPONSE_FORMATS = ("b64_json", "url")
OUTPUT_FORMATS = ("png", "jpeg", "webp")
QUALITIES = ("auto", "low", "medium", "high", "standard", "hd")
BACKGROUNDS = ("auto", "transparent", "opaque")
MODERATIONS = ("auto", "low")
MAX_N = 10
MAX_PARTIAL_IMAGES = 3
# Input images as Pillow names them, from their bytes (never from a filename or content type).
INPUT_FORMATS = {"PNG", "JPEG", "WEBP"}
# Seeds the gateway draws: within every engine's generator range.
DRAWN_SEED_BITS = 31


@dataclasses.dataclass(frozen=True)
class ImageRequest:
    model: str
    prompt: str
    n: int = 1
    size: tuple[int, int] | None = None  # None: auto
    response_format: str = "b64_json"
    output_format: str = "png"
    output_compression: int | None = None
    quality: str = "auto"
    background: str = "auto"
    stream: bool = False
    partial_images: int = 0
    negative_prompt: str = ""
    steps: int | None = None
    guidance_scale: float | None = None
    seed: int | None = None
    input_image: bytes = b""  # image-to-image, or an edit's source
    input_size: tuple[int, int] | None = None
    mask: bytes = b""
    edit: bool = False


def _size(v: str | None) -> tuple[int, int] | None:
    return None if v is None or v == "auto" else request_fields.parse_size(v)


def _image(data: bytes, param: str) -> tuple[int, int]:
    """The size of an input image, which must be PNG, JPEG or WebP (read from its bytes)."""
    if not data:
        raise InvalidRequest(f"'{param}' is empty", param=param)
    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.format not in INPUT_FORMATS:
                raise InvalidRequest(f"'{param}' must be a PNG, JPEG or WebP image; got {img.format}", param=param)
            return img.size
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError):
        raise InvalidRequest(f"'{param}' is not a readable PNG, JPEG or WebP image", param=param) from None


def _read(f: Fields, *, edit: bool) -> dict[str, Any]:
    """The fields both endpoints share, read from ``f``."""
    prompt = request_fields.prompt(f)
    out: dict[str, Any] = {
        "model": f.required_str("model"), "prompt": prompt, "edit": edit,
        "n": f.int("n", UINT32, lo=1, hi=MAX_N) or 1,
        "size": _size(f.str("size")),
        "response_format": f.str("response_format", allowed=RESPONSE_FORMATS) or "b64_json",
        "output_format": f.str("output_format", allowed=OUTPUT_FORMATS) or "png",
        "output_compression": f.int("output_compression", UINT32, lo=0, hi=100),
        "quality": f.str("quality", allowed=QUALITIES) or "auto",
        "background": f.str("background", allowed=BACKGROUNDS) or "auto",
        "stream": f.bool("stream"),
        "partial_images": f.int("partial_images", UINT32, lo=0, hi=MAX_PARTIAL_IMAGES) or 0,
    }
    f.str("user")
    f.str("safety_identifier")
    f.str("moderation", allowed=MODERATIONS)
    if out["output_compression"] is not None and out["output_format"] == "png":
        raise InvalidRequest("'output_compression' applies to jpeg and webp output only", param="output_compression")
    if out["background"] == "transparent" and out["output_format"] == "jpeg":
        raise InvalidRequest("'background': 'transparent' needs an output_format with transparency (png or webp)",
                             param="background")
    if out["stream"] and out["response_format"] == "url":
        raise InvalidRequest("a streamed answer carries the images as b64_json; 'response_format': 'url' needs "
                             "'stream': false", param="response_format")
    if out["partial_images"] and not out["stream"]:
        raise InvalidRequest("'partial_images' needs 'stream': true", param="partial_images")
    out.update(_nvext(f.nested("nvext")))
    return out


def _nvext(f: Fields | None) -> dict[str, Any]:
    if f is None:
        return {}
    out = {"negative_prompt": f.str("negative_prompt") or "",
           "steps": f.int("num_inference_steps", UINT32, lo=1),
           "guidance_scale": f.float("guidance_scale", lo=0.0),
           "seed": f.int("seed", UINT64)}
    f.reject_unknown()
    return out


def parse_generation(raw: bytes) -> ImageRequest:
    """POST /v1/images/generations: a JSON body."""
    f = Fields(load_json(raw))
    fields = _read(f, edit=False)
    reference = f.raw("input_reference")
    if reference is not None:
        fields["input_image"] = request_fields.inline_image(reference, "input_reference")
        fields["input_size"] = _image(fields["input_image"], "input_reference")
    f.reject_unknown()
    return ImageRequest(**fields)


# Multipart parts that are the edit's files, not text fields.
_FILE_FIELDS = ("image", "image[]", "mask")


def _form_body(form: Form) -> dict[str, Any]:
    """The edit's text fields as an object; ``nvext`` sent as one JSON text (rather than ``nvext[...]``
    fields) is read as the object it holds."""
    body = text_object(p for p in form.parts if p.name not in _FILE_FIELDS)
    if isinstance(body.get("nvext"), str):
        try:
            body["nvext"] = orjson.loads(body["nvext"])
        except orjson.JSONDecodeError:
            raise InvalidRequest("'nvext' must be a JSON object", param="nvext") from None
    return body


def parse_edit(raw: bytes, content_type: str) -> ImageRequest:
    """POST /v1/images/edits: multipart/form-data as ``client.images.edit(...)`` sends it."""
    form = parse_form(raw, content_type)
    f = FormFields(_form_body(form))
    fields = _read(f, edit=True)
    f.reject_unknown()
    images = form.all("image", "image[]")
    if not images:
        raise InvalidRequest("'image' is required: the image to edit", param="image")
    if len(images) > 1:
        raise InvalidRequest(f"this endpoint edits one image per request; got {len(images)}", param="image")
    fields["input_image"] = images[0].data
    fields["input_size"] = _image(images[0].data, "image")
    masks = form.all("mask")
    if len(masks) > 1:
        raise InvalidRequest("'mask' was given more than once", param="mask")
    if masks:
        if _image(masks[0].data, "mask") != fields["input_size"]:
            raise InvalidRequest("'mask' must have the same size as 'image'", param="mask")
        fields["mask"] = masks[0].data
    return ImageRequest(**fields)


def _auto_size(req: ImageRequest, limits: MediaLimits) -> tuple[int, int]:
    """``auto``: an input image's own size (scaled down to fit the model's maximum, keeping its aspect, and
    rounded down to the model's multiple), else the model's default."""
    if req.input_size is not None:
        m = limits.size_multiple
        width, height = req.input_size
        scale = min(1.0, limits.max_width / width, limits.max_height / height)
        w, h = int(width * scale) // m * m, int(height * scale) // m * m
        if w and h:
            return w, h
    return limits.default_width, limits.default_height


def resolve(req: ImageRequest, limits: MediaLimits, request_id: str) -> media_pb2.GenerateMediaRequest:
    """The worker's request, once ``req`` is checked against the model's limits (each miss a 400 naming
    the parameter); draws the seed when the client gave none."""
    width, height = req.size or _auto_size(req, limits)
    request_fields.check_size(width, height, limits)
    if req.n > limits.max_n:
        raise InvalidRequest(f"'n' must be at most {limits.max_n} for this model; got {req.n}", param="n")
    steps = request_fields.check_steps(req.steps or limits.default_steps, limits)
    request_fields.check_output_format(req.output_format, limits)
    request_fields.check_input_image(req.input_image, limits, "image" if req.edit else "input_reference")
    seed = req.seed if req.seed is not None else secrets.randbits(DRAWN_SEED_BITS)
    if seed + req.n - 1 > UINT64.hi:  # output i uses seed + i
        raise InvalidRequest(f"'nvext.seed' + n - 1 must fit 64 bits; got seed {seed}", param="nvext.seed")
    out = media_pb2.GenerateMediaRequest(
        request_id=request_id, model=req.model, kind=media_pb2.MEDIA_KIND_IMAGE, prompt=req.prompt,
        negative_prompt=req.negative_prompt, width=width, height=height, n=req.n, num_inference_steps=steps,
        seed=seed, input_image=req.input_image, mask=req.mask, output_format=req.output_format,
        partial_images=req.partial_images, background="" if req.background == "auto" else req.background,
        quality="" if req.quality == "auto" else req.quality)
    if req.guidance_scale is not None:
        out.guidance_scale = req.guidance_scale
    if req.output_compression is not None:
        out.output_compression = req.output_compression
    return out
