"""Fails worker calls that went silent: one periodic sweep instead of a timer per token.

Once a worker has sent a sequence's first tokens, a silence of ``idle_s`` means it is frozen
(SIGSTOP, a wedged host: the connection stays open), and the sequence must fail over like one on a
dead worker. Arming a timer around every read (``asyncio.wait_for`` or ``asyncio.timeout``) costs a
timer handle, and with ``wait_for`` a task, per token per request, which the profile showed at ~5 %
of the postprocessor. Here a read only stamps when it began waiting; a sweep every ``idle_s / 4``
fails the calls that have been waiting too long, so a frozen worker is noticed within 1.25 ×
``idle_s``. Time spent not waiting (the caller applying back-pressure) never counts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from services.common.assembly import cancel_within
from services.common.errors import MeshError, WorkerFailed

log = logging.getLogger(__name__)


class Watched:
    """One call under watch: ``waiting()`` before each read, ``got()`` after; ``expire`` fails it."""

    __slots__ = ("address", "expire", "since")

    def __init__(self, address: str, expire: Callable[[MeshError], None]):
        self.address = address
        self.expire = expire
        self.since: float | None = None  # when the current read began; None while not reading

    def waiting(self) -> None:
        self.since = time.monotonic()

    def got(self) -> None:
        self.since = None


class IdleWatch:
    """The sweep over every watched call of one postprocessor (started on first use, in its loop)."""

    def __init__(self, idle_s: float):
        self.idle_s = idle_s
        self._watched: set[Watched] = set()
        self._task: asyncio.Task[None] | None = None

    def watch(self, address: str, expire: Callable[[MeshError], None]) -> Watched:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._sweep())
        watched = Watched(address, expire)
        self._watched.add(watched)
        return watched

    def forget(self, watched: Watched) -> None:
        self._watched.discard(watched)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.idle_s / 4)
            deadline = time.monotonic() - self.idle_s
            for watched in [w for w in self._watched if w.since is not None and w.since < deadline]:
                self._watched.discard(watched)
                log.warning("worker %s sent nothing for %.1f s; treating it as failed", watched.address, self.idle_s)
                watched.expire(WorkerFailed("worker stopped responding"))
            if not self._watched:
                return  # nothing to watch: an idle postprocessor sleeps; the next ``watch`` starts a sweep

    async def close(self) -> None:
        if self._task is not None:
            await cancel_within([self._task])
