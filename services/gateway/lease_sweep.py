"""When a takeover sweep (batches, video jobs) may skip reading its whole bucket.

Listing a NATS KV bucket's keys creates and deletes a JetStream consumer: on an idle gateway, two sweeps
every 2 s made that most of the gateway's and NATS's idle CPU (bench/idle.py). A listing can find
something to take over only if the bucket was written since the last one, or a lease it saw has run out
since: the first shows in the bucket's stream sequence (one STREAM.INFO request, no consumer), the
second is a time this side computes. Otherwise the last listing's answer ("nothing to take over") still
holds, and the sweep skips it.

Even that check every 2 s was two JetStream API calls a second per gateway, each with its advisory, at
rest. So a sweep now sleeps until something can have changed (``BucketWrites``): a write to its bucket
(a core NATS subscription to the bucket's subjects), the earliest lease it saw running out, or
``RECHECK_S`` in case a write went by while the subscription was away (a NATS reconnect). Takeover stays
as prompt as before: a lease that runs out is checked at its time, spaced by the sweep's period.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Iterable

import nats
from nats.aio.msg import Msg
from nats.js.kv import KeyValue

from services.common.jetstream_replicas import through_failover
from services.common.nats_store import NatsStore, unavailable_on_nats_failure

# The longest a sweep sleeps with no write seen and no lease due: writes made while its subscription was away
# (NATS reconnecting) are noticed by then.
RECHECK_S = 30.0


async def bucket_sequence(store: NatsStore[KeyValue]) -> int:
    """The last sequence of the store's bucket stream: it moves with every write, purge and expiry marker."""
    kv = await store.opened()
    with unavailable_on_nats_failure("read the bucket's state"):
        status = await through_failover(kv.status, store.wait_s)
    return int(status.stream_info.state.last_seq)


class QuietSweep:
    """Remembers what the last full listing saw: the bucket's sequence and the earliest lease still running."""

    def __init__(self) -> None:
        self._sequence = -1
        self._due = math.inf

    def needed(self, sequence: int, now: float) -> bool:
        return sequence != self._sequence or now >= self._due

    def quiet_for(self, now: float) -> float:
        """How long nothing but a write can make a listing needed: 0 before the first listing."""
        if self._sequence < 0:
            return 0.0
        return min(RECHECK_S, max(0.0, self._due - now))

    def listed(self, sequence: int, running_leases: Iterable[float]) -> None:
        """After a listing read at ``sequence``: ``running_leases`` are the ``lease_until`` of the active
        records it left alone (their lease had not run out); the next listing is due at the earliest."""
        self._sequence = sequence
        self._due = min(running_leases, default=math.inf)


class BucketWrites:
    """Wakes a sweep when its store's bucket is written: every KV write is a message on ``$KV.<bucket>.<key>``,
    which a core subscription on the store's own connection sees (no consumer, nothing sent while idle)."""

    def __init__(self, store: NatsStore[KeyValue], bucket: str):
        self._store = store
        self._subject = f"$KV.{bucket}.>"
        self._written = asyncio.Event()
        self._nc: nats.NATS | None = None

    async def wait(self, timeout_s: float) -> None:
        """Returns at the next write (or at once if one came since the last return), or after ``timeout_s``.
        Subscribes first on a connection it has not followed yet (the first call, a store that reconnected
        afresh); ``StoreUnavailable`` while NATS is away."""
        nc = await self._store.connection()
        if nc is not self._nc:
            await nc.subscribe(self._subject, cb=self._seen)
            self._nc = nc
        if timeout_s > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await self._written.wait()
        self._written.clear()

    async def _seen(self, _msg: Msg) -> None:
        self._written.set()
