"""When a takeover sweep (batches, video jobs) may skip reading its whole bucket.

Listing a NATS KV bucket's keys creates and deletes a JetStream consumer: on an idle gateway, two sweeps
every 2 s made that most of the gateway's and NATS's idle CPU (bench/idle.py). A listing can find
something to take over only if the bucket was written since the last one, or a lease it saw has run out
since: the first shows in the bucket's stream sequence (one STREAM.INFO request, no consumer), the
second is a time this side computes. Otherwise the last listing's answer ("nothing to take over") still
holds, and the sweep skips it. Takeover stays as prompt as before: the check runs on every sweep.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from nats.js.kv import KeyValue

from services.common.jetstream_replicas import through_failover
from services.common.nats_store import NatsStore, unavailable_on_nats_failure


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

    def listed(self, sequence: int, running_leases: Iterable[float]) -> None:
        """After a listing read at ``sequence``: ``running_leases`` are the ``lease_until`` of the active
        records it left alone (their lease had not run out); the next listing is due at the earliest."""
        self._sequence = sequence
        self._due = min(running_leases, default=math.inf)
