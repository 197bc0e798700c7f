"""Which registrations in the worker bucket are live workers: decided by every reader, not by NATS alone.

The bucket's per-message TTL is not enough on its own. nats-server 2.15, killed after it has written
its stream state (every ~2 min, and at a clean stop), comes back with registrations that had already
expired restored, and its recovered TTL state does not list them, so they never expire: a service that
watches the bucket from then on sees dead workers for good (``TTL state is outdated`` in its log).
So the reader judges each registration itself:

- **Age when handed over.** The values a new watch starts with carry the server's timestamp of their
  last heartbeat. One older than the TTL (by this reader's clock) is a dead worker's and is ignored,
  unless this reader already knows the worker: a reader that watches afresh after a NATS outage then
  keeps its live workers until their next heartbeat instead of dropping them. Heartbeats that arrive
  on a running watch were just written and count as fresh, whatever the clocks say.
- **Silence.** A worker not heard from for ``SILENCE_TTLS`` TTLs while NATS is connected leaves, as if
  its key had expired. Twice the TTL, not once: the server's own expiry stays the fast path and this
  one must not fire on a reader whose event loop was briefly busy. While NATS is away nobody can be
  heard, so the silence clock restarts when it returns (and when a watch starts). A known worker that
  a new watch does not list (a NATS that lost its store) is left to this rule too, rather than
  dropped at once: if it is alive, its next heartbeat is at most a third of a TTL away.
- **One address, one worker.** A port has one listener (grpc binds without ``SO_REUSEPORT``), so when
  two ids register the same address, the one whose heartbeat NATS stamped later is the live one and
  the other is a dead worker whose port a new one reuses: a request pinned to it must not reach the
  new worker.

The table is pure (no NATS): ``WorkerRegistry`` feeds it and applies the changes it returns.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # discovery imports this module
    from services.common.discovery import WorkerCard

log = logging.getLogger(__name__)

SILENCE_TTLS = 2.0

# (worker id, its card, or None when it left)
Change = tuple[str, "WorkerCard | None"]


@dataclasses.dataclass
class _Worker:
    card: WorkerCard
    written: float  # the server's timestamp of its latest heartbeat (epoch seconds)
    heard: float  # this reader's monotonic time when that heartbeat arrived


class LiveWorkers:
    """The live workers of the bucket, as one reader sees them.

    Args:
        ttl_s: the registrations' TTL (workers heartbeat three times per TTL).
        clock: monotonic seconds (for silence); wall: epoch seconds (for the server's timestamps).
    """

    def __init__(self, ttl_s: float, *, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time):
        self.ttl_s = ttl_s
        self._clock = clock
        self._wall = wall
        self._workers: dict[str, _Worker] = {}

    def cards(self) -> dict[str, WorkerCard]:
        return {worker_id: w.card for worker_id, w in self._workers.items()}

    def heard(self, worker_id: str, card: WorkerCard, written: float, *, handed_over: bool) -> list[Change]:
        """A registration arrived; ``handed_over``: one of the values a new watch starts with."""
        known = self._workers.get(worker_id)
        age = self._wall() - written
        if handed_over and known is None and age > self.ttl_s:
            log.info("ignoring worker %s at %s: its last heartbeat is %.0f s old (a dead worker's registration "
                     "that NATS kept)", worker_id, card.address, age)
            return []
        changes: list[Change] = []
        for other_id, other in list(self._workers.items()):
            if other_id == worker_id or other.card.address != card.address:
                continue
            if other.written > written:
                log.info("ignoring worker %s at %s: worker %s registered that address later", worker_id,
                         card.address, other_id)
                return []
            log.info("worker %s at %s was replaced by worker %s on the same address", other_id, card.address,
                     worker_id)
            del self._workers[other_id]
            changes.append((other_id, None))
        self._workers[worker_id] = _Worker(card, written, self._clock())
        if known is None or known.card != card:
            changes.append((worker_id, card))
        return changes

    def left(self, worker_id: str) -> list[Change]:
        """Its key was deleted, purged or expired."""
        return [(worker_id, None)] if self._workers.pop(worker_id, None) is not None else []

    def expire(self) -> list[Change]:
        """Workers silent for ``SILENCE_TTLS`` TTLs leave."""
        limit = self._clock() - SILENCE_TTLS * self.ttl_s
        silent = [worker_id for worker_id, w in self._workers.items() if w.heard < limit]
        for worker_id in silent:
            log.info("worker %s has not been heard from for %.0f s; dropping it", worker_id,
                     self._clock() - self._workers[worker_id].heard)
        return [change for worker_id in silent for change in self.left(worker_id)]

    def restart_silence(self) -> None:
        """NATS is (or was just) away: nobody could be heard, so silence counts from now."""
        now = self._clock()
        for w in self._workers.values():
            w.heard = now
