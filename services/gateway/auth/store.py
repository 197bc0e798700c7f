"""The three buckets of keys and quotas in the mesh's namespace (NATS JetStream KV), on one connection.

- ``meshfront_keys_<namespace>``: one record per key (``KeyRecord`` JSON) under the SHA-256 of its secret;
  revoking deletes it. Every gateway replica watches the bucket (``follow_keys``): NATS pushes each change,
  so a new or revoked key is known everywhere within a round trip, and a request looks its key up in memory.
- ``meshfront_quotas_<namespace>``: one ``QuotaState`` per limited key (under its key id), changed only by a
  compare-and-set on its revision (``change_quota``): the loser of a race reads again and retries, so the
  counts hold across every replica.
- ``meshfront_usage_<namespace>``: each replica's running totals per tenant under ``<tenant>.<replica>``,
  written by that replica alone (plain puts); ``meshfront keys usage`` sums them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable

from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from services.common.jetstream_replicas import open_or_create
from services.common.kv_watch import FirstValues, key_count, quiet_flow_control
from services.common.namespace import Namespace
from services.common.nats_connection import stop_if_cancelled
from services.common.nats_store import NatsStore, unavailable_on_nats_failure
from services.gateway.auth.quota import QuotaState, Refusal

log = logging.getLogger(__name__)

KEYS_BUCKET = "meshfront_keys"
QUOTAS_BUCKET = "meshfront_quotas"
USAGE_BUCKET = "meshfront_usage"
# Compare-and-set tries before a quota change gives up (503): each lost try means another replica's write
# went through, so this many only fail under a storm of one key's requests.
CAS_TRIES = 32
# How often the key watch wakes to see whether NATS reconnected (then it watches afresh); no NATS traffic.
_RECONNECT_CHECK_S = 5.0


@dataclasses.dataclass(frozen=True)
class Buckets:
    keys: KeyValue
    quotas: KeyValue
    usage: KeyValue


async def open_buckets(js: JetStreamContext, namespace: Namespace) -> Buckets:
    """Opens (creating where missing) the namespace's three buckets; history 1: only the latest state counts."""
    async def one(base: str) -> KeyValue:
        name = namespace.bucket(base)
        return await open_or_create(lambda: js.key_value(name), lambda replicas: js.create_key_value(
            KeyValueConfig(bucket=name, history=1, replicas=replicas)))
    return Buckets(await one(KEYS_BUCKET), await one(QUOTAS_BUCKET), await one(USAGE_BUCKET))


class AuthStore(NatsStore[Buckets]):
    def __init__(self, nats_url: str, namespace: Namespace, *, wait_s: float = 5.0):
        super().__init__(nats_url, what="key store", client_name="gateway-keys", wait_s=wait_s,
                         call_timeout_s=wait_s)
        self.namespace = namespace

    async def _open(self, js: JetStreamContext) -> Buckets:
        return await open_buckets(js, self.namespace)

    async def follow_keys(self, apply: Callable[[str, bytes | None], None], synced: asyncio.Event) -> None:
        """Calls ``apply(hash, record JSON or None when deleted)`` for every key and change, for ever; sets
        ``synced`` once the bucket's current keys are all applied. Watches afresh after a NATS reconnect."""
        while True:
            try:
                buckets = await self.opened()
                assert self._nc is not None  # set once opened
                reconnects = self._nc.stats["reconnects"]
                # Synced when every key counted here came, not at nats-py's marker, which can come before them
                # (services/common/kv_watch.py): a valid key would be refused as unknown.
                first = FirstValues(await key_count(self._nc.jetstream(), self.namespace.bucket(KEYS_BUCKET), ">"))
                if first.complete:
                    synced.set()
                watcher = quiet_flow_control(await buckets.keys.watchall())
                try:
                    while self._nc.stats["reconnects"] == reconnects:
                        try:
                            entry = await watcher.updates(timeout=_RECONNECT_CHECK_S)
                        except NatsTimeoutError:
                            if first.quiet():
                                synced.set()
                            continue
                        if entry is not None:
                            deleted = entry.operation in (KV_DEL, KV_PURGE) or not entry.value
                            apply(entry.key, None if deleted else entry.value)
                        if first.took(entry):
                            synced.set()
                finally:
                    with contextlib.suppress(Exception):
                        async with asyncio.timeout(1.0):
                            await watcher.stop()
                log.info("NATS reconnected; watching the keys bucket afresh")
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - NATS away: keep the keys known, watch again
                stop_if_cancelled()
                log.warning("key watch interrupted (%s); keeping the keys known", e)
                await asyncio.sleep(1.0)

    async def change_quota(self, key_id: str,
                           change: Callable[[QuotaState, float], QuotaState | Refusal]) -> QuotaState | Refusal:
        """Applies ``change(state, now)`` to the key's quota record by compare-and-set; a ``Refusal`` is
        returned as it is, nothing written."""
        buckets = await self.opened()
        with unavailable_on_nats_failure(f"update the quota of {key_id}"):
            for _ in range(CAS_TRIES):
                try:
                    entry = await buckets.quotas.get(key_id)
                    state, last = QuotaState.from_json(entry.value or b""), entry.revision or 0
                except KeyNotFoundError:
                    state, last = QuotaState(), 0
                out = change(state, time.time())
                if isinstance(out, Refusal):
                    return out
                try:
                    if last:
                        await buckets.quotas.update(key_id, out.to_json(), last=last)
                    else:
                        await buckets.quotas.create(key_id, out.to_json())
                    return out
                except KeyWrongLastSequenceError:
                    continue  # another replica wrote first: read its state and decide again
        raise TimeoutError(f"{CAS_TRIES} compare-and-set tries lost")

    async def put_usage(self, key: str, value: bytes) -> None:
        buckets = await self.opened()
        with unavailable_on_nats_failure("store usage"):
            await buckets.usage.put(key, value)
