"""Chat content parts: text, ``image_url``, ``video_url`` and ``input_audio``, checked for shape and collected.

Images are http(s) URLs or ``data:image/...;base64,`` URLs, videos http(s) or ``data:video/...`` URLs;
audio is base64 ``wav`` or ``mp3``. A media part may carry a ``uuid`` (vLLM's multi_modal_uuids), and an
image or video part with a uuid and no URL (``image_url`` null or absent) reuses the item sent earlier
with that uuid. Nothing is fetched here: a URL is checked for shape, a data URL's payload for being
base64; the preprocessor fetches and decodes each item once (services/preprocessor/media/). Which models
accept which modality is a worker card field; the preprocessor refuses media a model does not declare.
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
_DATA_URL = re.compile(r"^data:((?:image|video)/[A-Za-z0-9.+-]+)(;[A-Za-z0-9=.+-]+)*;base64,(.*)$", re.DOTALL)
# part type -> (modality, the object holding its URL)
_URL_PARTS = {"image_url": ("image", "image_url"), "video_url": ("video", "video_url")}
MAX_UUID_CHARS = 256


@dataclasses.dataclass(frozen=True)
class Media:
    """One image, video or audio part, where it sits in the conversation."""

    modality: str  # "image" | "video" | "audio"
    message_index: int
    part_index: int
    url: str = ""
    data: str = ""
    format: str = ""
    detail: str = ""
    uuid: str = ""  # the client's id for the item; a part with only a uuid reuses an earlier item


def _names(where: str, keys: set[str]) -> str:
    return ", ".join(f"'{where}.{k}'" for k in sorted(keys))


def _base64(payload: str, param: str, what: str) -> None:
    try:
        base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"{what} is not valid base64", param=param) from None
    if not payload:
        raise InvalidRequest(f"{what} is empty", param=param)


def check_image_url(url: Any, where: str, param: str, kind: str = "image") -> None:
    """An http(s) URL with a host, or a base64 ``kind`` data URL; ``where`` names it in the message."""
    if not isinstance(url, str) or not url:
        raise InvalidRequest(f"'{where}' must be a non-empty string", param=param)
    if url.startswith("data:"):
        m = _DATA_URL.match(url)
        if m is None or not m.group(1).startswith(kind + "/"):
            raise InvalidRequest(f"'{where}' must be a data:{kind}/<type>;base64,<data> URL", param=param)
        _base64(m.group(3), param, f"the data of '{where}'")
        return
    try:
        parsed = urllib.parse.urlsplit(url)
        scheme, host = parsed.scheme, parsed.hostname
    except ValueError:  # a malformed netloc (an unclosed IPv6 bracket, a bad port)
        scheme, host = "", None
    if scheme not in ("http", "https") or not host or any(c.isspace() for c in url):
        raise InvalidRequest(f"'{where}' must be an http(s) URL or a data: URL", param=param)


def _uuid(part: dict[str, Any], where: str, param: str) -> str:
    uuid = part.get("uuid")
    if uuid is None:
        return ""
    if not isinstance(uuid, str) or not uuid or len(uuid) > MAX_UUID_CHARS:
        raise InvalidRequest(f"'{where}.uuid' must be a non-empty string of at most {MAX_UUID_CHARS} characters",
                             param=param)
    return uuid


def _url_part(part: dict[str, Any], where: str, i: int, j: int) -> Media:
    param = f"messages[{i}].content"
    modality, key = _URL_PARTS[part["type"]]
    extra = set(part) - {"type", key, "uuid"}
    if extra:
        raise InvalidRequest(f"Unsupported parameter(s): {_names(where, extra)}", param=param)
    uuid = _uuid(part, where, param)
    obj = part.get(key)
    if obj is None and uuid:
        return Media(modality, i, j, uuid=uuid)  # reuses the item sent earlier with this uuid
    if not isinstance(obj, dict):
        raise InvalidRequest(f"'{where}.{key}' must be an object with a url (or null, with a uuid naming an "
                             f"earlier {modality})", param=param)
    allowed = {"url", "detail"} if modality == "image" else {"url"}
    unknown = set(obj) - allowed
    if unknown:
        raise InvalidRequest(f"Unsupported parameter(s): {_names(where + '.' + key, unknown)}", param=param)
    check_image_url(obj.get("url"), f"{where}.{key}.url", param, modality)
    detail = obj.get("detail")
    if detail is not None and detail not in IMAGE_DETAILS:
        raise InvalidRequest(f"'{where}.{key}.detail' must be one of {', '.join(IMAGE_DETAILS)}", param=param)
    return Media(modality, i, j, url=obj["url"], detail=detail or "", uuid=uuid)


def _audio(part: dict[str, Any], where: str, i: int, j: int) -> Media:
    param = f"messages[{i}].content"
    extra = set(part) - {"type", "input_audio", "uuid"}
    if extra:
        raise InvalidRequest(f"Unsupported parameter(s): {_names(where, extra)}", param=param)
    uuid = _uuid(part, where, param)
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
    return Media("audio", i, j, data=data, format=fmt, uuid=uuid)


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
        if kind not in ("image_url", "video_url", "input_audio"):
            raise InvalidRequest(f"'{where}': unsupported content part type {kind!r}; supported: text, image_url, "
                                 "video_url, input_audio", param=f"messages[{i}].content")
        if role not in MEDIA_ROLES:
            raise InvalidRequest(f"'{where}': {kind} parts are only allowed in user messages, not {role!r}",
                                 param=f"messages[{i}].content")
        media.append(_audio(part, where, i, j) if kind == "input_audio" else _url_part(part, where, i, j))
    return media
