"""The start-up gate of ``--router-min-initial-workers`` (Dynamo's flag of that name).

A router that starts before its workers would answer the first requests "model does not exist" or
pile them onto the first worker to register. With a minimum of N, the router holds every Route call
and reports NOT_SERVING until N workers are registered; from then on the gate stays open whatever
workers come and go (it is about start-up, as in Dynamo, not a floor on capacity). 0 opens it at once.
"""

from __future__ import annotations

import asyncio


class WorkerGate:
    """Open once ``min_workers`` distinct workers have been registered at the same time."""

    def __init__(self, min_workers: int = 0):
        self.min_workers = min_workers
        self._registered: set[str] = set()
        self._open = asyncio.Event()
        if min_workers <= 0:
            self._open.set()

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    @property
    def registered(self) -> int:
        """Workers registered now, as far as the gate counts (it stops counting once open)."""
        return len(self._registered)

    def on_worker_change(self, worker_id: str, present: bool) -> None:
        if self.is_open:
            return
        if present:
            self._registered.add(worker_id)
        else:
            self._registered.discard(worker_id)
        if len(self._registered) >= self.min_workers:
            self._open.set()
            self._registered.clear()  # no longer needed: the gate never closes again

    async def wait(self) -> None:
        """Returns once the gate is open (at once when it is)."""
        await self._open.wait()
