"""Generated media behind ``url`` responses, in a NATS JetStream Object Store shared by every gateway replica.

Bucket ``meshfront_media_<namespace>`` (stream ``OBJ_meshfront_media_<namespace>``: one per namespace,
services/common/namespace.py) in the Object Store's own layout, so the ``nats object`` tools read it: an
object's chunks on ``$O.<bucket>.C.<nuid>``, its info (JSON) on ``$O.<bucket>.M.<base64 name>``.
The layout is written and read here rather than by nats-py's ``ObjectStore.put``/``get``, which read a
whole object into memory and take a blocking reader; a 50 MB video goes through here one chunk at a time
in both directions (``put`` publishes each chunk as it comes, ``open`` fetches the next chunk by direct get
when the caller asks for it).

Ids are ``secrets.token_urlsafe(32)`` (256 random bits: a URL cannot be guessed). An object expires
twice over: its info carries ``Meshfront-Expires-At``, which ``open`` checks, so a URL is a 404 the
moment its TTL is over; and every message is published with a per-message TTL (NATS 2.11) of that
length plus ``DOWNLOAD_GRACE_S`` (so a download that began in time ends whole), which reclaims the
storage without anyone reading it. The bucket's max age is a backstop at the longest TTL a gateway
accepts. Replicas with different ``--media-url-ttl-s`` share the bucket: each
object keeps the TTL of the gateway that stored it. NATS is reached as every store reaches it
(services/common/nats_store.py): NATS away is a 503.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import json
import logging
import re
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator

from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError

from services.common.errors import NotFound
from services.common.jetstream_replicas import ensure_stream, publish_through_failover, through_failover
from services.common.namespace import DEFAULT_NAMESPACE, Namespace
from services.common.nats_store import NatsStore, unavailable_on_nats_failure

log = logging.getLogger(__name__)

BUCKET = "meshfront_media"  # then _<namespace>: each namespace's media in a stream of its own
# The longest --media-url-ttl-s (a week).
MAX_TTL_S = 7 * 24 * 3600
# How long an object's messages outlive its URL: a download that started before the URL expired finishes.
DOWNLOAD_GRACE_S = 120
# Chunks as stored: well under NATS's default max payload (1 MiB), whatever size the caller hands in.
CHUNK = 512 * 1024
EXPIRES = "Meshfront-Expires-At"
CONTENT_TYPE = "Content-Type"
_ID = re.compile(r"^[-_a-zA-Z0-9]{16,128}$")


def new_id() -> str:
    return secrets.token_urlsafe(32)


def _pieces(data: bytes) -> list[bytes]:
    return [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)]


class MediaStore(NatsStore[JetStreamContext]):
    def __init__(self, nats_url: str, ttl_s: int, *, wait_s: float = 5.0, namespace: Namespace = DEFAULT_NAMESPACE):
        super().__init__(nats_url, what="media store", client_name="gateway-media", wait_s=wait_s,
                         call_timeout_s=wait_s)
        self.ttl_s = ttl_s
        self.bucket = namespace.bucket(BUCKET)
        self.stream = f"OBJ_{self.bucket}"

    def _meta_subject(self, media_id: str) -> str:
        return f"$O.{self.bucket}.M.{base64.urlsafe_b64encode(media_id.encode()).decode()}"

    def _chunk_subject(self, nuid: str) -> str:
        return f"$O.{self.bucket}.C.{nuid}"

    async def _open(self, js: JetStreamContext) -> JetStreamContext:
        # The Object Store's stream, plus per-message TTLs.
        def config(replicas: int) -> api.StreamConfig:
            return api.StreamConfig(
                name=self.stream, subjects=[f"$O.{self.bucket}.C.>", f"$O.{self.bucket}.M.>"],
                max_age=MAX_TTL_S + DOWNLOAD_GRACE_S,
                discard=api.DiscardPolicy.NEW, allow_rollup_hdrs=True, allow_direct=True, allow_msg_ttl=True,
                num_replicas=replicas)

        await ensure_stream(js, self.stream, config)
        return js

    async def put(self, chunks: AsyncIterator[bytes], content_type: str, ttl_s: int | None = None) -> str:
        """Stores the bytes ``chunks`` yields, one chunk at a time; returns the new object's id."""
        js = await self.opened()
        ttl = self.ttl_s if ttl_s is None else ttl_s
        media_id = new_id()
        nuid = secrets.token_hex(11)  # the chunks' subject: fresh per object, as the Object Store does
        subject = self._chunk_subject(nuid)
        digest = hashlib.sha256()
        size = count = 0
        try:
            with unavailable_on_nats_failure("store the result"):
                async for data in chunks:
                    for piece in _pieces(data):
                        digest.update(piece)
                        await publish_through_failover(js, self.stream, subject, piece, timeout_s=self.wait_s,
                                                       msg_ttl=ttl + DOWNLOAD_GRACE_S)
                        size += len(piece)
                        count += 1
                expires_at = time.time() + ttl
                info = api.ObjectInfo(
                    name=media_id, bucket=self.bucket, nuid=nuid, size=size, chunks=count,
                    mtime=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    digest="SHA-256=" + base64.urlsafe_b64encode(digest.digest()).decode(),
                    headers={CONTENT_TYPE: [content_type], EXPIRES: [f"{expires_at:.3f}"]})
                await publish_through_failover(js, self.stream, self._meta_subject(media_id),
                                               json.dumps(info.as_dict()).encode(), timeout_s=self.wait_s,
                                               headers={api.Header.ROLLUP: "sub"}, msg_ttl=ttl + DOWNLOAD_GRACE_S)
        except BaseException:
            with contextlib.suppress(Exception):  # what was published of it is garbage now
                await js.purge_stream(self.stream, subject=subject)
            raise
        return media_id

    async def _info(self, media_id: str) -> api.ObjectInfo:
        js = await self.opened()
        with unavailable_on_nats_failure("read the media store"):
            try:
                msg = await through_failover(lambda: js.get_last_msg(self.stream, self._meta_subject(media_id)),
                                             self.wait_s)
            except NotFoundError:
                raise _gone() from None
        info = api.ObjectInfo.from_response(json.loads(msg.data or b"{}"))
        if info.deleted or float((info.headers or {}).get(EXPIRES, ["0"])[0]) <= time.time():
            raise _gone()
        return info

    async def open(self, media_id: str) -> tuple[str, int, AsyncGenerator[bytes, None]]:
        """(content type, size, the bytes chunk by chunk); ``NotFound`` for an unknown, expired or deleted id."""
        if not _ID.match(media_id):
            raise _gone()
        info = await self._info(media_id)
        content_type = (info.headers or {}).get(CONTENT_TYPE, ["application/octet-stream"])[0]
        return content_type, info.size or 0, self._chunks(media_id, info)

    async def _chunks(self, media_id: str, info: api.ObjectInfo) -> AsyncGenerator[bytes, None]:
        js = await self.opened()
        subject, seq = self._chunk_subject(info.nuid), 1
        for _ in range(info.chunks or 0):
            with unavailable_on_nats_failure("read the media store"):
                try:
                    msg = await through_failover(functools.partial(js.get_msg, self.stream, seq=seq, subject=subject,
                                                                   next=True, direct=True), self.wait_s)
                except NotFoundError:
                    # Deleted while it was being read (an expiry leaves DOWNLOAD_GRACE_S for that).
                    raise _gone() from None
            assert msg.seq is not None
            seq = msg.seq + 1
            yield msg.data or b""

    async def delete(self, media_id: str) -> bool:
        """Forgets an object; False when there was none."""
        if not _ID.match(media_id):
            return False
        try:
            info = await self._info(media_id)
        except NotFound:
            return False
        js = await self.opened()
        info.deleted, info.size, info.chunks, info.digest = True, 0, 0, ""
        with unavailable_on_nats_failure("remove it from the media store"):
            await publish_through_failover(js, self.stream, self._meta_subject(media_id),
                                           json.dumps(info.as_dict()).encode(),
                                           timeout_s=self.wait_s, headers={api.Header.ROLLUP: "sub"},
                                           msg_ttl=self.ttl_s)
            await through_failover(lambda: js.purge_stream(self.stream, subject=self._chunk_subject(info.nuid)),
                                   self.wait_s)
        return True


def _gone() -> NotFound:
    return NotFound("No such media: it never existed, or its URL expired.", param="media_id")


def media_url(media_id: str, public_url: str, headers: dict[str, str]) -> str:
    """The URL of a stored object: ``{base}/v1/media/{id}``.

    ``base`` is ``--public-url`` when set (a gateway behind a proxy that rewrites hosts); else the
    scheme and host the client used to reach the edge, which Envoy forwards as ``x-forwarded-proto``
    and ``x-forwarded-host`` (set from the request's authority by its Lua filter).
    """
    if public_url:
        base = public_url
    else:
        proto = headers.get("x-forwarded-proto", "http").split(",")[0].strip() or "http"
        host = headers.get("x-forwarded-host") or headers.get("host") or headers.get(":authority") or "localhost"
        base = f"{proto}://{host.split(',')[0].strip()}"
    return f"{base}/v1/media/{media_id}"
