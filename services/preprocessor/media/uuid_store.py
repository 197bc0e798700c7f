"""Media sent with a uuid, shared by every preprocessor replica through a NATS JetStream stream.

A part naming only a uuid must find its media whichever replica the gateway's round robin picks, so the
bytes sent with a uuid are written here as well as to the replica's own LRU (``resolve.UuidCache``), which
stays in front: a hit there costs no NATS round trip. Entries are keyed by the uuid alone, as vLLM's
processor cache and Dynamo key them (the uuid is the client's name for the content) and as the per-replica
cache always has.

Stream ``MESHFRONT_MEDIA_UUIDS_<namespace>`` (one per namespace, services/common/namespace.py):

- ``meshfront.media_uuids.<namespace>.M.<sha256 of the uuid>``: the item's description (JSON: modality, content
  hash, size, chunk count, chunk subject, the decoded measurements), rolled up so the last write wins;
- ``meshfront.media_uuids.<namespace>.C.<nuid>``: its bytes in 512 KiB chunks (NATS's default max payload is
  1 MiB).

Bounded by ``--media-uuid-ttl-s`` (max age) and ``--media-uuid-store-bytes`` (max bytes, oldest dropped
first), both set by the replica that creates the stream. An item whose chunks were dropped before its
description reads as a miss: every read is checked against the content hash. The store never fails a
request: NATS away or a write refused (``StoreUnavailable``, as for every store: services/common/nats_store.py)
is logged, and a read that cannot be made is a miss (the client is told to send the media again). Reads and
writes wait out a leader election (``through_failover``).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import json
import logging
import secrets
import time

from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError

from services.common.jetstream_replicas import ensure_stream, publish_through_failover, through_failover
from services.common.namespace import DEFAULT_NAMESPACE, Namespace
from services.common.nats_store import NatsStore, StoreUnavailable, unavailable_on_nats_failure
from services.preprocessor.media import decode
from services.preprocessor.media.resolve import Resolved, content_hash

log = logging.getLogger(__name__)

STREAM = "MESHFRONT_MEDIA_UUIDS"  # then _<namespace>
_PREFIX = "meshfront.media_uuids"  # then .<namespace>
CHUNK = 512 * 1024
_TRY_S = 2.0  # one NATS call; a leader election is waited out in tries of this length
_RECENT = 4096  # uuids this replica wrote lately: the same item sent again is not written again


class SharedUuids(NatsStore[JetStreamContext]):
    """The replicas' common uuid -> media map (``get``/``put``).

    NATS is reached on the first use, by a background task that keeps trying; a request waits for it at most
    ``connect_s`` (then its uuid is a miss, or its item is not shared), so NATS being away costs each request
    that second at most, never a failure or a pile of connection attempts.
    """

    def __init__(self, nats_url: str, ttl_s: float, max_bytes: int, *, connect_s: float = 1.0,
                 namespace: Namespace = DEFAULT_NAMESPACE):
        super().__init__(nats_url, what="media uuid store", client_name="preprocessor-uuids", wait_s=connect_s,
                         call_timeout_s=_TRY_S)
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self.stream = namespace.bucket(STREAM)
        self._prefix = namespace.subject(_PREFIX)
        self._written: collections.OrderedDict[str, tuple[int, float]] = collections.OrderedDict()

    async def _open(self, js: JetStreamContext) -> JetStreamContext:
        def config(replicas: int) -> api.StreamConfig:
            return api.StreamConfig(name=self.stream, subjects=[f"{self._prefix}.>"], max_age=self.ttl_s,
                                    max_bytes=self.max_bytes, discard=api.DiscardPolicy.OLD,
                                    allow_rollup_hdrs=True, allow_direct=True, num_replicas=replicas)

        await ensure_stream(js, self.stream, config)
        return js

    def _meta_subject(self, uuid: str) -> str:
        return f"{self._prefix}.M.{hashlib.sha256(uuid.encode()).hexdigest()}"

    def _chunk_subject(self, nuid: str) -> str:
        return f"{self._prefix}.C.{nuid}"

    async def put(self, uuid: str, item: Resolved) -> None:
        """Stores ``item`` under ``uuid`` unless this replica stored the same content there lately."""
        recent = self._written.get(uuid)
        if recent is not None and recent[0] == item.content_hash and time.monotonic() - recent[1] < self.ttl_s / 2:
            return
        if len(item.content) > self.max_bytes:
            return
        try:
            js = await self.opened()
            with unavailable_on_nats_failure(f"share media uuid {uuid!r}"):
                nuid = secrets.token_hex(11)
                pieces = [item.content[i:i + CHUNK] for i in range(0, len(item.content), CHUNK)]
                for piece in pieces:
                    await publish_through_failover(js, self.stream, self._chunk_subject(nuid), piece, timeout_s=_TRY_S)
                meta = {"modality": item.modality, "content_hash": item.content_hash, "size": len(item.content),
                        "chunks": len(pieces), "nuid": nuid, "info": dataclasses.asdict(item.info)}
                await publish_through_failover(js, self.stream, self._meta_subject(uuid), json.dumps(meta).encode(),
                                               timeout_s=_TRY_S, headers={api.Header.ROLLUP: "sub"})
        except StoreUnavailable as e:
            log.warning("media uuid %r not shared with the other preprocessors (%s)", uuid, e.message)
            return
        self._written[uuid] = (item.content_hash, time.monotonic())
        self._written.move_to_end(uuid)
        while len(self._written) > _RECENT:
            self._written.popitem(last=False)

    async def get(self, uuid: str) -> Resolved | None:
        """The item stored under ``uuid``, or None (never stored, expired, dropped for room, or NATS away)."""
        try:
            js = await self.opened()
            with unavailable_on_nats_failure(f"read media uuid {uuid!r}"):
                try:
                    meta, content = await self._read(js, uuid)
                except NotFoundError:
                    return None
        except StoreUnavailable as e:
            log.warning("media uuid %r: the shared store cannot be read (%s)", uuid, e.message)
            return None
        if len(content) != meta["size"] or content_hash(content) != meta["content_hash"]:
            return None  # its first chunks were dropped for room before its description
        return Resolved(meta["modality"], content, meta["content_hash"], decode.Decoded(**meta["info"]))

    async def _read(self, js: JetStreamContext, uuid: str) -> tuple[dict, bytes]:
        """(the item's description, its bytes); ``NotFoundError`` when there is none."""
        msg = await through_failover(lambda: js.get_last_msg(self.stream, self._meta_subject(uuid), direct=True),
                                     _TRY_S)
        meta = json.loads(msg.data or b"{}")
        parts: list[bytes] = []
        seq = 1
        for _ in range(meta["chunks"]):
            chunk = await through_failover(functools.partial(
                js.get_msg, self.stream, seq=seq, subject=self._chunk_subject(meta["nuid"]), next=True, direct=True),
                _TRY_S)
            assert chunk.seq is not None
            seq = chunk.seq + 1
            parts.append(chunk.data or b"")
        return meta, b"".join(parts)
