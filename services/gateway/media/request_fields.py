"""The request fields the Images and Videos APIs share, read and checked one way for both.

The prompt, an input image sent inline (a ``data:image/...;base64,`` URL or bare base64: the gateway
fetches no URL), a ``WIDTHxHEIGHT`` size, and the checks against the model's ``MediaLimits`` that both
make (the size, the step count, the output format, whether it takes an input image). Each front end keeps
its own fields and shapes: services/gateway/images/request.py and services/gateway/videos/request.py.
Every refusal is a 400 naming the field.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from services.common.discovery import MediaLimits
from services.common.errors import InvalidRequest
from services.gateway.core.fields import Fields

MAX_PROMPT_CHARS = 32_000
# What an inline input image may be (the workers decode these; Pillow checks the bytes where it matters).
INLINE_IMAGE_TYPES = ("png", "jpeg", "jpg", "webp")
_SIZE = re.compile(r"^([1-9][0-9]{0,5})x([1-9][0-9]{0,5})$")
_DATA_URL = re.compile(r"^data:image/([A-Za-z0-9.+-]+);base64,(.*)$", re.S)


def prompt(f: Fields) -> str:
    text = f.required_str("prompt")
    if len(text) > MAX_PROMPT_CHARS:
        raise InvalidRequest(f"'prompt' may hold at most {MAX_PROMPT_CHARS} characters; got {len(text)}",
                             param="prompt")
    return text


def inline_image(v: Any, param: str) -> bytes:
    """An input image sent inline: a ``data:image/...;base64,`` URL or bare base64, never a URL to fetch."""
    if not isinstance(v, str) or not v:
        raise InvalidRequest(f"'{param}' must be a data URL (data:image/png;base64,...) or base64 text", param=param)
    if v.startswith(("http://", "https://")):
        raise InvalidRequest(f"'{param}': the gateway does not fetch URLs; send the image inline as a data URL",
                             param=param)
    m = _DATA_URL.match(v)
    if m and m.group(1).lower() not in INLINE_IMAGE_TYPES:
        raise InvalidRequest(f"'{param}' must be a PNG, JPEG or WebP image; got image/{m.group(1)}", param=param)
    try:
        raw = base64.b64decode(m.group(2) if m else v, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"'{param}' is not valid base64 (or a data:image/png|jpeg|webp;base64 URL)",
                             param=param) from None
    if not raw:
        raise InvalidRequest(f"'{param}' is empty", param=param)
    return raw


def parse_size(text: str) -> tuple[int, int]:
    """(width, height) of a ``WIDTHxHEIGHT`` size."""
    m = _SIZE.match(text)
    if not m:
        raise InvalidRequest(f"'size' must be WIDTHxHEIGHT in pixels (e.g. 1280x720); got {text!r}", param="size")
    return int(m.group(1)), int(m.group(2))


def check_size(width: int, height: int, limits: MediaLimits) -> None:
    m = limits.size_multiple
    if not (m <= width <= limits.max_width and m <= height <= limits.max_height) or width % m or height % m:
        raise InvalidRequest(f"'size' {width}x{height} is not one this model makes: width {m}-{limits.max_width} "
                             f"and height {m}-{limits.max_height}, each a multiple of {m}", param="size")


def check_steps(steps: int, limits: MediaLimits) -> int:
    if steps > limits.max_steps:
        raise InvalidRequest(f"'nvext.num_inference_steps' must be at most {limits.max_steps} for this model; "
                             f"got {steps}", param="nvext.num_inference_steps")
    return steps


def check_output_format(output_format: str, limits: MediaLimits) -> None:
    if output_format not in limits.output_formats:
        raise InvalidRequest(f"'output_format' must be one of {', '.join(limits.output_formats)} for this model; "
                             f"got {output_format!r}", param="output_format")


def check_input_image(image: bytes, limits: MediaLimits, param: str) -> None:
    if image and not limits.takes_image:
        raise InvalidRequest(f"this model does not take an input image; leave '{param}' out", param=param)
