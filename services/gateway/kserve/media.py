"""KServe v2 media models: an image or video model as a tensor model (pure: no grpc).

A prompt in, encoded bytes out (docs/media.md, "KServe media models"):

- inputs: ``prompt`` (BYTES [1], required), ``negative_prompt`` (BYTES [1]), ``input_image`` (BYTES [1]:
  an encoded PNG/JPEG/WebP, for models that take one);
- parameters: ``size`` (string "WxH"), ``seed`` (int), ``steps`` (int), ``guidance_scale`` (number),
  ``output_format`` (string: png | jpeg | webp, or mp4 | mjpeg); images also ``n`` (int); videos also
  ``seconds`` and ``fps`` (numbers) and ``num_frames`` (int), which must agree as on /v1/videos;
- output: ``output`` (BYTES [n]), one encoded image or video per element; the response's parameters
  say ``content_type``, ``seed`` (output i used seed + i) and ``inference_time_s`` (videos: ``fps`` and
  ``num_frames`` too).

Every value is checked against the model's ``MediaLimits`` with the same checks as the HTTP APIs, and the
defaults are the model's. An unknown input, parameter or output is INVALID_ARGUMENT naming it.
"""

from __future__ import annotations

import secrets
from typing import Any

from meshfront.worker.v1 import media_pb2

from services.common.discovery import VIDEOS, ModelCard
from services.common.errors import InvalidRequest
from services.gateway.core.fields import INT64, check_float, check_int
from services.gateway.kserve.tensors import Tensor, one_string, read_inputs
from services.gateway.media.video_spec import SEED_BITS, VideoParams, check_size, media_request, resolve

INPUTS = {"prompt": ("BYTES", [1]), "negative_prompt": ("BYTES", [1]), "input_image": ("BYTES", [1])}
OUTPUTS = {"output": ("BYTES", [-1])}
COMMON_PARAMS = frozenset({"size", "seed", "steps", "guidance_scale", "output_format"})
IMAGE_PARAMS = COMMON_PARAMS | {"n"}
VIDEO_PARAMS = COMMON_PARAMS | {"seconds", "fps", "num_frames"}


def _image_bytes(t: Tensor) -> bytes:
    if t.datatype != "BYTES" or len(t.values) != 1 or not t.values[0]:
        raise InvalidRequest(f"input '{t.name}' must be BYTES with one non-empty element: the encoded image",
                             param=t.name)
    return t.values[0]


def _str(params: dict[str, Any], key: str) -> str | None:
    v = params.get(key)
    if v is not None and not isinstance(v, str):
        raise InvalidRequest(f"parameter '{key}' must be a string", param=key)
    return v


def _int(params: dict[str, Any], key: str, lo: int = 0) -> int | None:
    return None if key not in params else check_int(params[key], key, INT64, lo)


def _float(params: dict[str, Any], key: str, lo: float, hi: float) -> float | None:
    return None if key not in params else check_float(params[key], key, lo, hi)


def parse_media(request, card: ModelCard, params: dict[str, Any], request_id: str) -> media_pb2.GenerateMediaRequest:
    """A ModelInferRequest for a media model -> the worker's request, checked against the model's limits."""
    video = card.serves(VIDEOS)
    allowed = VIDEO_PARAMS if video else IMAGE_PARAMS
    unknown = sorted(k for k in params if k not in allowed)
    if unknown:
        raise InvalidRequest(f"Unsupported parameter(s) for a {'video' if video else 'image'} model: "
                             f"{', '.join(repr(k) for k in unknown)}", param=unknown[0])
    inputs = read_inputs(request)
    for name in inputs:
        if name not in INPUTS:
            raise InvalidRequest(f"unknown input '{name}'; a media model takes {', '.join(INPUTS)}", param=name)
    for out in request.outputs:
        if out.name not in OUTPUTS:
            raise InvalidRequest(f"unknown output '{out.name}'; a media model produces 'output'", param=out.name)
    if "prompt" not in inputs:
        raise InvalidRequest("a media model needs a 'prompt' input (BYTES [1])", param="prompt")
    prompt = one_string(inputs["prompt"])
    negative = one_string(inputs["negative_prompt"]) if "negative_prompt" in inputs else ""
    image = _image_bytes(inputs["input_image"]) if "input_image" in inputs else b""
    steps = _int(params, "steps", 1)
    guidance = _float(params, "guidance_scale", 0.0, 100.0)
    seed = _int(params, "seed")
    fmt = _str(params, "output_format")
    if video:
        return _video_request(card, request_id, VideoParams(
            model=card.name, prompt=prompt, seconds=_float(params, "seconds", 0.001, 3600.0),
            size=_str(params, "size"), input_image=image, fps=_float(params, "fps", 0.001, 120.0),
            num_frames=_int(params, "num_frames", 1), negative_prompt=negative, steps=steps,
            guidance_scale=guidance, seed=seed, output_format=fmt or "mp4"))
    return _image_request(card, params, request_id, prompt, negative, image, steps, guidance, seed, fmt)


# The HTTP API's names (resolve's messages) -> this API's parameter and input names.
_RENAMES = {"nvext.num_frames": "num_frames", "nvext.fps": "fps", "nvext.num_inference_steps": "steps",
            "input_reference": "input_image"}


def _video_request(card: ModelCard, request_id: str, video: VideoParams) -> media_pb2.GenerateMediaRequest:
    limits = card.media
    assert limits is not None  # a media card carries its limits
    try:
        spec = resolve(video, limits)
    except InvalidRequest as e:
        message = e.message
        for http_name, name in _RENAMES.items():
            message = message.replace(f"'{http_name}'", f"'{name}'")
        raise InvalidRequest(message, param=_RENAMES.get(e.param or "", e.param)) from None
    return media_request(spec, request_id)


def _image_request(card: ModelCard, params: dict[str, Any], request_id: str, prompt: str, negative: str,
                   image: bytes, steps: int | None, guidance: float | None, seed: int | None,
                   fmt: str | None) -> media_pb2.GenerateMediaRequest:
    limits = card.media
    assert limits is not None  # a media card carries its limits
    width, height = check_size(_str(params, "size"), limits)
    n = _int(params, "n", 1) or 1
    if n > limits.max_n:
        raise InvalidRequest(f"parameter 'n' must be at most {limits.max_n} for this model; got {n}", param="n")
    steps = steps if steps is not None else limits.default_steps
    if steps > limits.max_steps:
        raise InvalidRequest(f"parameter 'steps' must be at most {limits.max_steps} for this model; got {steps}",
                             param="steps")
    fmt = fmt or limits.output_formats[0]
    if fmt not in limits.output_formats:
        raise InvalidRequest(f"parameter 'output_format' must be one of {', '.join(limits.output_formats)}; "
                             f"got {fmt!r}", param="output_format")
    if image and not limits.takes_image:
        raise InvalidRequest("this model does not take an input image", param="input_image")
    req = media_pb2.GenerateMediaRequest(
        request_id=request_id, model=card.name, kind=media_pb2.MEDIA_KIND_IMAGE, prompt=prompt,
        negative_prompt=negative, width=width, height=height, n=n, num_inference_steps=steps,
        seed=seed if seed is not None else secrets.randbits(SEED_BITS), input_image=image, output_format=fmt)
    if guidance is not None:
        req.guidance_scale = guidance
    return req
