"""Video jobs in a NATS JetStream key-value bucket (``meshfront_video_jobs_<namespace>``), shared by every gateway
replica of the namespace.

A record is the job's JSON: what the client sees (status, progress, timestamps, error), what it runs
(the checked ``VideoSpec``, its input image kept in the media store), where its video went (a media
id), and who runs it: ``owner`` (a gateway replica's id) and ``lease_until`` (epoch seconds). Every
change is a compare-and-set on the key's revision, so two replicas never both believe they own a job:
the loser of a race gets ``LeaseLost`` and stops. A record expires on its own per-message TTL at the
job's ``expires_at`` (the media TTL from its creation), which every read checks as well, so expiry is
exact even between NATS's TTL sweeps.

NATS is reached as every store reaches it (services/common/nats_store.py): on its own connection opened
in the background; a call made before NATS answers waits ``wait_s`` and then fails with 503.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import re
import time
from typing import Any

import orjson
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig
from nats.js.errors import APIError, KeyNotFoundError, NoKeysError
from nats.js.kv import KeyValue

from services.common.jetstream_replicas import (
    WRONG_LAST,
    open_or_create,
    publish_through_failover,
    through_failover,
)
from services.common.namespace import DEFAULT_NAMESPACE, Namespace
from services.common.nats_store import NatsStore, unavailable_on_nats_failure

log = logging.getLogger(__name__)

BUCKET = "meshfront_video_jobs"  # then _<namespace>
_KEY = re.compile(r"^video_[A-Za-z0-9_-]{1,64}$")


class LeaseLost(Exception):
    """The record changed under us (another replica took the job over, or it was deleted)."""


@dataclasses.dataclass
class JobEntry:
    """A record and the revision it was read at (the next compare-and-set's expectation)."""

    record: dict[str, Any]
    revision: int


def valid_id(video_id: str) -> bool:
    return bool(_KEY.match(video_id))


class JobStore(NatsStore[KeyValue]):
    def __init__(self, nats_url: str, *, wait_s: float = 5.0, namespace: Namespace = DEFAULT_NAMESPACE):
        super().__init__(nats_url, what="video job store", client_name="gateway-video-jobs", wait_s=wait_s,
                         call_timeout_s=wait_s)
        self.bucket = namespace.bucket(BUCKET)

    async def _open(self, js: JetStreamContext) -> KeyValue:
        # history 1: only the job's latest state matters; per-message TTLs are on (nats-py sets allow_msg_ttl).
        return await open_or_create(lambda: js.key_value(self.bucket), lambda replicas: js.create_key_value(
            KeyValueConfig(bucket=self.bucket, history=1, replicas=replicas)))

    async def _publish(self, video_id: str, record: dict[str, Any], last: int) -> int:
        """Writes ``record`` if the key is still at revision ``last`` (0: absent); its TTL ends at expires_at."""
        js = await self.jetstream()
        ttl = max(1, math.ceil(record["expires_at"] - time.time()))
        headers = {"Nats-Expected-Last-Subject-Sequence": str(last)}
        with unavailable_on_nats_failure(f"store video job {video_id}"):
            try:
                ack = await publish_through_failover(js, f"KV_{self.bucket}", f"$KV.{self.bucket}.{video_id}",
                                                     orjson.dumps(record), timeout_s=self.wait_s, headers=headers,
                                                     msg_ttl=ttl)
            except APIError as e:
                if e.err_code in WRONG_LAST:
                    raise LeaseLost(video_id) from None
                raise
        return ack.seq

    async def create(self, record: dict[str, Any]) -> JobEntry:
        return JobEntry(record, await self._publish(record["id"], record, 0))

    async def update(self, entry: JobEntry, **changes: Any) -> JobEntry:
        """The record with ``changes``, written only if nobody wrote it since ``entry`` was read."""
        record = {**entry.record, **changes}
        return JobEntry(record, await self._publish(record["id"], record, entry.revision))

    async def get(self, video_id: str) -> JobEntry | None:
        """The job, or None when there is none (never created, expired or deleted)."""
        if not valid_id(video_id):
            return None
        kv = await self.opened()
        with unavailable_on_nats_failure(f"read video job {video_id}"):
            try:
                entry = await through_failover(lambda: kv.get(video_id), self.wait_s)
            except KeyNotFoundError:
                return None
        if not entry.value:
            return None
        record = orjson.loads(entry.value)
        if record["expires_at"] <= time.time():
            return None
        assert entry.revision is not None
        return JobEntry(record, entry.revision)

    async def all(self) -> list[JobEntry]:
        """Every live job (the list endpoint and the takeover sweep read the whole bucket: jobs are few)."""
        kv = await self.opened()
        with unavailable_on_nats_failure("list video jobs"):
            try:
                keys = await through_failover(kv.keys, self.wait_s)
            except NoKeysError:
                return []
        entries = await asyncio.gather(*(self.get(k) for k in keys))
        return [e for e in entries if e is not None]

    async def delete(self, video_id: str) -> None:
        kv = await self.opened()
        with unavailable_on_nats_failure(f"delete video job {video_id}"):
            # The purge marker expires too, so deleted jobs leave nothing behind.
            await through_failover(lambda: kv.purge(video_id, msg_ttl=60), self.wait_s)
