"""What the Batch API keeps in NATS JetStream, shared by every gateway replica of the namespace.

- ``RecordStore``: JSON records in a KV bucket (history 1), every change a compare-and-set on the key's
  revision: batches (``meshfront_batches_<namespace>``, the lease lives in the record: ``owner``,
  ``lease_until``) and file objects (``meshfront_files_<namespace>``). Two replicas never both believe they
  hold a batch: the loser of a race gets ``LeaseLost``.
- ``LineStore``: each finished line's outcome (``meshfront_batch_lines_<namespace>``, key
  ``<batch_id>.<line index>``), written create-only BEFORE the line counts: a replica that takes a batch over
  reads which lines are done and runs only the others, and a line two replicas both finished is recorded once
  (the second create loses), so no line is lost or written twice. Purged once the batch's files are written.
- ``FileContents``: a file's bytes, in the Object Store layout of services/gateway/media/store.py (its own
  bucket ``meshfront_files_<namespace>``, chunked, never whole in one message).

Everything expires on its own (per-message TTLs): records and files ``FILE_TTL_S`` after their last write.
NATS away is ``StoreUnavailable`` (a 503), as for every store (services/common/nats_store.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import orjson
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext, api
from nats.js.api import KeyValueConfig
from nats.js.errors import APIError, KeyNotFoundError, NoKeysError
from nats.js.kv import KeyValue

from services.common.jetstream_replicas import (
    WRONG_LAST,
    ensure_stream,
    open_or_create,
    publish_through_failover,
    through_failover,
)
from services.common.kv_watch import FirstValues, key_count
from services.common.namespace import DEFAULT_NAMESPACE, Namespace
from services.common.nats_store import NatsStore, unavailable_on_nats_failure
from services.gateway.batch.lines import Outcome
from services.gateway.media.store import DOWNLOAD_GRACE_S, MediaStore

log = logging.getLogger(__name__)

# Batches, files and their bytes stay this long after their last write (OpenAI keeps batch outputs 30 days).
FILE_TTL_S = 30 * 24 * 3600
BATCHES, FILES, LINES = "meshfront_batches", "meshfront_files", "meshfront_batch_lines"


class LeaseLost(Exception):
    """The record changed under us (another replica took the batch over, or a cancel landed): read it again."""


@dataclasses.dataclass
class Entry:
    """A record and the revision it was read at (the next compare-and-set's expectation)."""

    record: dict[str, Any]
    revision: int


def _kv_config(bucket: str) -> Callable[[int], Any]:
    return lambda replicas: KeyValueConfig(bucket=bucket, history=1, replicas=replicas)


class RecordStore(NatsStore[KeyValue]):
    def __init__(self, nats_url: str, base: str, valid_key: Callable[[str], bool], *, wait_s: float = 5.0,
                 namespace: Namespace = DEFAULT_NAMESPACE, ttl_s: int = FILE_TTL_S):
        super().__init__(nats_url, what=f"{base} store", client_name=f"gateway-{base}", wait_s=wait_s,
                         call_timeout_s=wait_s)
        self.bucket = namespace.bucket(base)
        self.valid_key = valid_key
        self.ttl_s = ttl_s

    async def _open(self, js: JetStreamContext) -> KeyValue:
        return await open_or_create(lambda: js.key_value(self.bucket),
                                    lambda replicas: js.create_key_value(_kv_config(self.bucket)(replicas)))

    async def _publish(self, key: str, record: dict[str, Any], last: int) -> int:
        """Writes ``record`` if the key is still at revision ``last`` (0: absent); ``LeaseLost`` otherwise."""
        js = await self.jetstream()
        headers = {"Nats-Expected-Last-Subject-Sequence": str(last)}
        with unavailable_on_nats_failure(f"store {key}"):
            try:
                ack = await publish_through_failover(js, f"KV_{self.bucket}", f"$KV.{self.bucket}.{key}",
                                                     orjson.dumps(record), timeout_s=self.wait_s, headers=headers,
                                                     msg_ttl=self.ttl_s)
            except APIError as e:
                if e.err_code in WRONG_LAST:
                    raise LeaseLost(key) from None
                raise
        return ack.seq

    async def create(self, record: dict[str, Any]) -> Entry:
        return Entry(record, await self._publish(record["id"], record, 0))

    async def put(self, record: dict[str, Any]) -> Entry:
        """Writes ``record`` whatever is there (a batch's output file, written again after a takeover)."""
        current = await self.get(record["id"])
        return Entry(record, await self._publish(record["id"], record, current.revision if current else 0))

    async def update(self, entry: Entry, **changes: Any) -> Entry:
        """The record with ``changes``, written only if nobody wrote it since ``entry`` was read."""
        record = {**entry.record, **changes}
        return Entry(record, await self._publish(record["id"], record, entry.revision))

    async def get(self, key: str) -> Entry | None:
        if not self.valid_key(key):
            return None
        kv = await self.opened()
        with unavailable_on_nats_failure(f"read {key}"):
            try:
                entry = await through_failover(lambda: kv.get(key), self.wait_s)
            except KeyNotFoundError:
                return None
        if not entry.value:
            return None
        assert entry.revision is not None
        return Entry(orjson.loads(entry.value), entry.revision)

    async def all(self) -> list[Entry]:
        """Every record (the list endpoints and the takeover sweep read the whole bucket)."""
        kv = await self.opened()
        with unavailable_on_nats_failure(f"list {self.bucket}"):
            try:
                keys = await through_failover(kv.keys, self.wait_s)
            except NoKeysError:
                return []
        entries = await asyncio.gather(*(self.get(k) for k in keys))
        return [e for e in entries if e is not None]

    async def delete(self, key: str) -> None:
        kv = await self.opened()
        with unavailable_on_nats_failure(f"delete {key}"):
            await through_failover(lambda: kv.purge(key, msg_ttl=60), self.wait_s)


class LineStore(NatsStore[KeyValue]):
    def __init__(self, nats_url: str, *, wait_s: float = 5.0, namespace: Namespace = DEFAULT_NAMESPACE):
        super().__init__(nats_url, what="batch line store", client_name="gateway-batch-lines", wait_s=wait_s,
                         call_timeout_s=wait_s)
        self.bucket = namespace.bucket(LINES)

    async def _open(self, js: JetStreamContext) -> KeyValue:
        return await open_or_create(lambda: js.key_value(self.bucket),
                                    lambda replicas: js.create_key_value(_kv_config(self.bucket)(replicas)))

    async def record(self, batch_id: str, index: int, outcome: Outcome) -> bool:
        """Records a finished line, create-only; False when it was recorded already (by another replica)."""
        await self.opened()
        js = await self.jetstream()
        with unavailable_on_nats_failure(f"record line {index} of {batch_id}"):
            try:
                await publish_through_failover(js, f"KV_{self.bucket}", f"$KV.{self.bucket}.{batch_id}.{index}",
                                               outcome.to_record(), timeout_s=self.wait_s,
                                               headers={"Nats-Expected-Last-Subject-Sequence": "0"},
                                               msg_ttl=FILE_TTL_S)
            except APIError as e:
                if e.err_code in WRONG_LAST:
                    return False
                raise
        return True

    async def done(self, batch_id: str) -> dict[int, Outcome]:
        """Every recorded line of a batch, by index: one ordered consumer over its keys, not a get per line.

        The watch's "nothing more" marker is not enough: nats-py sends it when the consumer's info says nothing is
        pending and nothing was received yet, and on a loaded machine that answer can overtake lines the server
        has already sent (a takeover read none of ten recorded lines, and would have run them again). So the
        stream is asked first how many keys the batch has, and the read goes on past an early marker until every
        one came, or nothing more came for ``wait_s``."""
        kv = await self.opened()
        js = await self.jetstream()
        out: dict[int, Outcome] = {}
        with unavailable_on_nats_failure(f"read the lines of {batch_id}"):
            first = FirstValues(await key_count(js, self.bucket, f"{batch_id}.*"))
            watcher = await kv.watch(f"{batch_id}.*")  # deletes too: they count among the stream's keys
            try:
                while not first.complete:
                    try:
                        entry = await watcher.updates(timeout=self.wait_s)
                    except NatsTimeoutError:
                        log.warning("lines of %s: not all of its %d keys read; going on without the rest", batch_id,
                                    first.expected)
                        break
                    if entry is not None and entry.value:
                        out[int(entry.key.rsplit(".", 1)[1])] = Outcome.from_record(entry.value)
                    first.took(entry)  # the marker, early or not, ends nothing here
            finally:
                await watcher.stop()
        return out

    async def purge(self, batch_id: str) -> None:
        """Forgets a batch's lines (its files hold them now)."""
        js = await self.jetstream()
        with unavailable_on_nats_failure(f"purge the lines of {batch_id}"):
            await through_failover(lambda: js.purge_stream(f"KV_{self.bucket}",
                                                           subject=f"$KV.{self.bucket}.{batch_id}.>"), self.wait_s)


class FileContents(MediaStore):
    """Files' bytes: the media store's chunked Object Store layout in a bucket of their own, kept longer."""

    def __init__(self, nats_url: str, *, wait_s: float = 5.0, namespace: Namespace = DEFAULT_NAMESPACE):
        super().__init__(nats_url, FILE_TTL_S, wait_s=wait_s, namespace=namespace)
        self.bucket = namespace.bucket(FILES)
        self.stream = f"OBJ_{self.bucket}"

    async def _open(self, js: JetStreamContext) -> JetStreamContext:
        def config(replicas: int) -> api.StreamConfig:
            return api.StreamConfig(
                name=self.stream, subjects=[f"$O.{self.bucket}.C.>", f"$O.{self.bucket}.M.>"],
                max_age=FILE_TTL_S + DOWNLOAD_GRACE_S, discard=api.DiscardPolicy.NEW, allow_rollup_hdrs=True,
                allow_direct=True, allow_msg_ttl=True, num_replicas=replicas)

        await ensure_stream(js, self.stream, config)
        return js
