"""One request's media, fetched or decoded once: bytes, MIME type, content hash and size per part.

- http(s) URLs go through ``fetch.UrlFetcher`` (address checks, size, redirect and time bounds); the same
  URL twice in a request is fetched once.
- data URLs and ``input_audio`` data are decoded from base64 within the size bound.
- Images are decoded with Pillow, videos and audio with PyAV (``decode.py``), off the event loop; audio at
  16 kHz mono, its length bounded (--media-max-audio-s).
- A part that names only a ``uuid`` reuses the item sent with that uuid earlier in the request or in a
  recent request: a bounded LRU of bytes in this process, in front of the store every preprocessor replica
  shares (``uuid_store.py``), so the uuid is found whichever replica the part reaches; an unknown uuid is
  a 400.

Every refusal is an ``InvalidRequest`` naming the part and saying why.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Sequence
from typing import Protocol

import xxhash

from services.common.errors import InvalidRequest
from services.preprocessor.media import audio, decode
from services.preprocessor.media.fetch import FetchRefused, UrlFetcher
from services.preprocessor.media.limits import MediaLimits

_URL_FIELD = {"image": "image_url.url", "video": "video_url.url"}


class MediaPart(Protocol):
    """What the gateway sends for each part (common.proto MediaItem)."""

    modality: str
    url: str
    data: str
    format: str
    uuid: str
    message_index: int
    part_index: int


@dataclasses.dataclass(frozen=True)
class Resolved:
    modality: str
    content: bytes
    content_hash: int
    info: decode.Decoded


def content_hash(raw: bytes) -> int:
    """XXH3-64, seed 0: the item's identity for KV hashes and engine caches."""
    return xxhash.xxh3_64_intdigest(raw)


def _where(part: MediaPart) -> str:
    return f"messages[{part.message_index}].content[{part.part_index}]"


def _refuse(part: MediaPart, field: str, why: str) -> InvalidRequest:
    return InvalidRequest(f"'{_where(part)}.{field}': {why}", param=f"messages[{part.message_index}].content")


class UuidCache:
    """Recently sent media by uuid, bounded in bytes (least recently used dropped first)."""

    def __init__(self, max_bytes: int):
        self._max = max_bytes
        self._items: collections.OrderedDict[str, Resolved] = collections.OrderedDict()
        self._bytes = 0

    def get(self, uuid: str) -> Resolved | None:
        item = self._items.get(uuid)
        if item is not None:
            self._items.move_to_end(uuid)
        return item

    def put(self, uuid: str, item: Resolved) -> None:
        if len(item.content) > self._max:
            return
        old = self._items.pop(uuid, None)
        if old is not None:
            self._bytes -= len(old.content)
        self._items[uuid] = item
        self._bytes += len(item.content)
        while self._bytes > self._max:
            _, dropped = self._items.popitem(last=False)
            self._bytes -= len(dropped.content)


class SharedMedia(Protocol):
    """Media by uuid shared with the other preprocessor replicas (``uuid_store.SharedUuids``)."""

    async def get(self, uuid: str) -> Resolved | None: ...

    async def put(self, uuid: str, item: Resolved) -> None: ...

    async def close(self) -> None: ...


class MediaResolver:
    def __init__(self, limits: MediaLimits, fetcher: UrlFetcher | None = None, shared: SharedMedia | None = None):
        self.limits = limits
        self._fetcher = fetcher or UrlFetcher(limits)
        self._uuids = UuidCache(limits.uuid_cache_bytes)
        self._shared = shared

    async def close(self) -> None:
        await self._fetcher.close()
        if self._shared is not None:
            await self._shared.close()

    async def _by_uuid(self, uuid: str) -> Resolved | None:
        """This replica's item for ``uuid``, else the one another replica stored (then kept here too)."""
        item = self._uuids.get(uuid)
        if item is None and self._shared is not None:
            item = await self._shared.get(uuid)
            if item is not None:
                self._uuids.put(uuid, item)
        return item

    async def resolve(self, parts: Sequence[MediaPart]) -> list[Resolved]:
        """Each part's media, in order. Raises InvalidRequest for the first part that cannot be used."""
        if len(parts) > self.limits.max_items:
            raise InvalidRequest(f"the request has {len(parts)} media parts; the limit is {self.limits.max_items}",
                                 param="messages")
        fetches: dict[str, asyncio.Task[tuple[bytes, str]]] = {}
        for part in parts:
            if part.url.startswith(("http://", "https://")) and part.url not in fetches:
                fetches[part.url] = asyncio.ensure_future(self._fetcher.fetch(part.url))
        try:
            return await self._resolve_in_order(parts, fetches)
        finally:
            for task in fetches.values():
                if not task.done():
                    task.cancel()
                elif not task.cancelled():
                    task.exception()  # retrieved: a fetch refused after an earlier part failed logs nothing

    async def _resolve_in_order(self, parts: Sequence[MediaPart],
                                fetches: dict[str, asyncio.Task[tuple[bytes, str]]]) -> list[Resolved]:
        out: list[Resolved] = []
        by_uuid: dict[str, Resolved] = {}
        decoded: dict[str, Resolved] = {}  # URL -> its item, so a URL repeated in the request decodes once
        total = 0
        for part in parts:
            if not part.url and not part.data:  # a uuid-only reference
                item = by_uuid.get(part.uuid) or await self._by_uuid(part.uuid)
                if item is None:
                    raise _refuse(part, "uuid", f"no {part.modality} was sent with uuid {part.uuid!r} (send it once "
                                                "with its URL and uuid)")
                if item.modality != part.modality:
                    raise _refuse(part, "uuid", f"uuid {part.uuid!r} names a {item.modality}, not a {part.modality}")
            else:
                if part.url and part.url in decoded:
                    item = decoded[part.url]
                else:
                    item = await self._load(part, fetches)
                    if part.url:
                        decoded[part.url] = item
                if part.uuid:
                    self._uuids.put(part.uuid, item)
                    if self._shared is not None:  # awaited: the client's next request may reach another replica
                        await self._shared.put(part.uuid, item)
            if part.uuid:
                by_uuid[part.uuid] = item
            out.append(item)
            total += len(item.content)
            if total > self.limits.max_total_bytes:
                raise InvalidRequest(f"the request's media come to more than {self.limits.max_total_bytes} bytes "
                                     "together", param="messages")
        return out

    async def _load(self, part: MediaPart, fetches: dict[str, asyncio.Task[tuple[bytes, str]]]) -> Resolved:
        field = "input_audio.data" if part.modality == "audio" else _URL_FIELD[part.modality]
        try:
            if part.modality == "audio":
                raw = decode.base64_payload(part.data, self.limits.max_bytes)
            elif part.url.startswith("data:"):
                raw = decode.data_url_payload(part.url, self.limits.max_bytes)
            else:
                raw, _ = await fetches[part.url]
            if part.modality == "image":
                info = await asyncio.to_thread(decode.decode_image, raw)
            elif part.modality == "video":
                info = await asyncio.to_thread(decode.decode_video, raw)
            else:
                info = await asyncio.to_thread(decode.decode_audio, raw, part.format, audio.SAMPLING_RATE,
                                               self.limits.max_audio_s)
        except (FetchRefused, decode.DecodeRefused) as e:
            raise _refuse(part, field, str(e)) from None
        return Resolved(part.modality, raw, content_hash(raw), info)
