"""Chat content parts: text, ``image_url`` and ``input_audio``, checked for shape and collected as media.

Images are http(s) URLs or ``data:image/...;base64,`` URLs; audio is base64 ``wav`` or ``mp3``.
Nothing is fetched here (the mesh has no business reaching the internet on a client's behalf, and
a worker's engine resolves URLs itself): a URL is checked for shape only, a data URL's payload for
being base64. Which models accept which modality is a worker card field; the preprocessor refuses
media a model does not declare, naming the model.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import re
import urllib.parse
from typing import Any

from services.common.errors import InvalidRequest

IMAGE_DETAILS = ("auto", "low", "high")
AUDIO_FORMATS = ("wav", "mp3")
# Roles whose content may hold images or audio (as at OpenAI: what the user shows the model).
MEDIA_ROLES = ("user",)
# Text-like parts: a refusal is how OpenAI hands back an assistant's refusal in history.
_TEXT_KEYS = {"text": "text", "refusal": "refusal"}
_DATA_URL = re.compile(r"^data:(image/[A-Za-z0-9.+-]+)(;[A-Za-z0-9=.+-]+)*;base64,(.*)$", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class Media:
    """One image or audio part, where it sits in the conversation."""

    modality: str  # "image" | "audio"
    message_index: int
    part_index: int
    url: str = ""
    data: str = ""
    format: str = ""
    detail: str = ""


def _names(where: str, keys: set[str]) -> str:
    return ", ".join(f"'{where}.{k}'" for k in sorted(keys))


def _base64(payload: str, param: str, what: str) -> None:
    try:
        base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"{what} is not valid base64", param=param) from None
    if not payload:
        raise InvalidRequest(f"{what} is empty", param=param)


def check_image_url(url: Any, where: str, param: str) -> None:
    """An http(s) URL with a host, or a base64 image data URL; ``where`` names it in the message."""
    if not isinstance(url, str) or not url:
        raise InvalidRequest(f"'{where}' must be a non-empty string", param=param)
    if url.startswith("data:"):
        m = _DATA_URL.match(url)
        if m is None:
            raise InvalidRequest(f"'{where}' must be a data:image/<type>;base64,<data> URL", param=param)
        _base64(m.group(3), param, f"the data of '{where}'")
        return
    try:
        parsed = urllib.parse.urlsplit(url)
        scheme, host = parsed.scheme, parsed.hostname
    except ValueError:  # a malformed netloc (an unclosed IPv6 bracket, a bad port)
        scheme, host = "", None
    if scheme not in ("http", "https") or not host or any(c.isspace() for c in url):
        raise InvalidRequest(f"'{where}' must be an http(s) URL or a data: URL", param=param)


def _image(part: dict[str, Any], where: str, i: int, j: int) -> Media:
    param = f"messages[{i}].content"
    extra = set(part) - {"type", "image_url"}
    if extra:
        raise InvalidRequest(f"Unsupported parameter(s): {_names(where, extra)}", param=param)
    image = part.get("image_url")
    if not isinstance(image, dict):
        raise InvalidRequest(f"'{where}.image_url' must be an object with a url", param=param)
    unknown = set(image) - {"url", "detail"}
    if unknown:
        raise InvalidRequest(f"Unsupported parameter(s): {_names(where + '.image_url', unknown)}", param=param)
    check_image_url(image.get("url"), f"{where}.image_url.url", param)
    detail = image.get("detail")
    if detail is not None and detail not in IMAGE_DETAILS:
        raise InvalidRequest(f"'{where}.image_url.detail' must be one of {', '.join(IMAGE_DETAILS)}",
                             param=param)
    return Media("image", i, j, url=image["url"], detail=detail or "")


def _audio(part: dict[str, Any], where: str, i: int, j: int) -> Media:
    param = f"messages[{i}].content"
    extra = set(part) - {"type", "input_audio"}
    if extra:
        raise InvalidRequest(f"Unsupported parameter(s): {_names(where, extra)}", param=param)
    audio = part.get("input_audio")
    if not isinstance(audio, dict) or set(audio) - {"data", "format"}:
        raise InvalidRequest(f"'{where}.input_audio' must be an object with data and format",
                             param=param)
    data, fmt = audio.get("data"), audio.get("format")
    if fmt not in AUDIO_FORMATS:
        raise InvalidRequest(f"'{where}.input_audio.format' must be one of {', '.join(AUDIO_FORMATS)}",
                             param=param)
    if not isinstance(data, str):
        raise InvalidRequest(f"'{where}.input_audio.data' must be a base64 string", param=param)
    _base64(data, param, f"'{where}.input_audio.data'")
    return Media("audio", i, j, data=data, format=fmt)


def check_content_parts(i: int, role: str, content: list[Any]) -> list[Media]:
    """Checks message ``i``'s content parts; returns its media in order."""
    media: list[Media] = []
    for j, part in enumerate(content):
        where = f"messages[{i}].content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(part, dict) or not isinstance(kind, str):
            raise InvalidRequest(f"'{where}' must be an object with a type", param=f"messages[{i}].content")
        if kind in _TEXT_KEYS:
            if not isinstance(part.get(_TEXT_KEYS[kind]), str):
                raise InvalidRequest(f"'{where}.{_TEXT_KEYS[kind]}' must be a string", param=f"messages[{i}].content")
            continue
        if kind not in ("image_url", "input_audio"):
            raise InvalidRequest(f"'{where}': unsupported content part type {kind!r}; supported: text, image_url, "
                                 "input_audio", param=f"messages[{i}].content")
        if role not in MEDIA_ROLES:
            raise InvalidRequest(f"'{where}': {kind} parts are only allowed in user messages, not {role!r}",
                                 param=f"messages[{i}].content")
        media.append(_image(part, where, i, j) if kind == "image_url" else _audio(part, where, i, j))
    return media
