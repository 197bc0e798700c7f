"""Stored responses in a NATS JetStream key-value bucket, shared by every gateway replica.

A record is the response object and the whole conversation behind it (every input item of the chain,
the earlier outputs included), so a continuation on any replica rebuilds the prompt from one read. Each
record expires on its own per-message TTL (``--responses-ttl-s`` of the gateway that wrote it; whole
seconds, as NATS counts them). Records are zlib-compressed JSON: a conversation is mostly text and
NATS refuses messages over its max payload (1 MiB by default).

NATS is reached as every store reaches it (services/common/nats_store.py): on its own connection,
opened in the background so the gateway starts without NATS; a call made before NATS answers waits up
to ``wait_s`` and then fails with 503 instead of hanging.
"""

from __future__ import annotations

import logging
import re
import zlib
from typing import Any

import orjson
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from services.common.jetstream_replicas import open_or_create, publish_through_failover, through_failover
from services.common.namespace import DEFAULT_NAMESPACE, Namespace
from services.common.nats_store import NatsStore, unavailable_on_nats_failure

log = logging.getLogger(__name__)

BUCKET = "meshfront_responses"  # then _<namespace>: one bucket per namespace
# What NATS accepts as a key; an id with anything else was never stored (and would be a client error).
_KEY = re.compile(r"^[-/_=.a-zA-Z0-9]+$")


def encode(record: dict[str, Any]) -> bytes:
    return zlib.compress(orjson.dumps(record))


def decode(raw: bytes) -> dict[str, Any]:
    return orjson.loads(zlib.decompress(raw))


def valid_key(response_id: str) -> bool:
    return bool(_KEY.match(response_id)) and not response_id.startswith(".") and not response_id.endswith(".")


class ResponseStore(NatsStore[KeyValue]):
    def __init__(self, nats_url: str, ttl_s: int, *, wait_s: float = 5.0, namespace: Namespace = DEFAULT_NAMESPACE):
        super().__init__(nats_url, what="response store", client_name="gateway-responses", wait_s=wait_s,
                         call_timeout_s=wait_s)
        self.ttl_s = ttl_s
        self.bucket = namespace.bucket(BUCKET)

    async def _open(self, js: JetStreamContext) -> KeyValue:
        # history 1: a record is written once; per-message TTLs are on (nats-py sets allow_msg_ttl).
        return await open_or_create(lambda: js.key_value(self.bucket), lambda replicas: js.create_key_value(
            KeyValueConfig(bucket=self.bucket, history=1, replicas=replicas)))

    async def put(self, response_id: str, record: dict[str, Any]) -> None:
        js = await self.jetstream()
        with unavailable_on_nats_failure(f"store response {response_id}", "; send 'store': false to skip storing"):
            # KeyValue.create's write, through publish_through_failover: a create retried after the dying leader
            # stored it would otherwise meet its own record and fail.
            await publish_through_failover(js, f"KV_{self.bucket}", f"$KV.{self.bucket}.{response_id}", encode(record),
                                           timeout_s=self.wait_s, msg_ttl=self.ttl_s,
                                           headers={"Nats-Expected-Last-Subject-Sequence": "0"})

    async def get(self, response_id: str) -> dict[str, Any] | None:
        """The record, or None when there is none (never stored, expired or deleted)."""
        if not valid_key(response_id):
            return None
        kv = await self.opened()
        with unavailable_on_nats_failure(f"read response {response_id}"):
            try:
                entry = await through_failover(lambda: kv.get(response_id), self.wait_s)
            except KeyNotFoundError:
                return None
        return decode(entry.value) if entry.value else None

    async def delete(self, response_id: str) -> bool:
        """Forgets a record; False when there was none."""
        if await self.get(response_id) is None:
            return False
        kv = await self.opened()
        with unavailable_on_nats_failure(f"delete response {response_id}"):
            # The purge marker expires too, so deleted records leave nothing behind.
            await through_failover(lambda: kv.purge(response_id, msg_ttl=self.ttl_s), self.wait_s)
        return True
