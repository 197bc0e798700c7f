"""What a service's ``build(config, ...)`` returns: the service object and what runs and closes with it.

Each service builds itself from its config in one function (services/<svc>/assembly.py) that both
its own process (``main``) and the all-in-one process (services/allinone) call, so both shapes
honour every flag. The caller owns the event loop, the gRPC server and the worker registry: it
calls ``start`` once the loop runs (background work such as NATS subscriptions that retry until
NATS is up) and ``close`` after the server stopped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, Generic, TypeVar

S = TypeVar("S")
log = logging.getLogger(__name__)
CLOSE_WAIT_S = 2.0


async def cancel_within(tasks: Iterable[asyncio.Task], timeout: float = CLOSE_WAIT_S) -> set[asyncio.Task]:
    """Cancels ``tasks`` and waits for them at most ``timeout`` s; returns those still running.

    Bounded because a task that swallowed its cancel (nats-py does, in places: see
    ``nats_connection.stop_if_cancelled``) must not hold a process past its stop.
    """
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    if not tasks:
        return set()
    _, pending = await asyncio.wait(tasks, timeout=timeout)
    return pending


@dataclasses.dataclass
class Built(Generic[S]):
    service: S
    # Coroutine factories run as tasks by ``start`` and cancelled by ``close``.
    background: list[Callable[[], Coroutine[Any, Any, None]]] = dataclasses.field(default_factory=list)
    # Run in order by ``close``, after the background tasks are cancelled.
    closers: list[Callable[[], Awaitable[None]]] = dataclasses.field(default_factory=list)
    # Named parts for the caller and tests (the router's KV event ingest, its metrics, ...).
    parts: dict[str, Any] = dataclasses.field(default_factory=dict)
    _tasks: list[asyncio.Task] = dataclasses.field(default_factory=list, init=False, repr=False)

    def start(self) -> None:
        """Starts the background work; needs a running event loop."""
        loop = asyncio.get_running_loop()
        self._tasks += [loop.create_task(make(), name=repr(make)) for make in self.background]

    async def close(self) -> None:
        pending = await cancel_within(self._tasks)
        if pending:  # named, so that the next such hang has a culprit
            log.warning("background tasks did not stop within %.0f s: %s", CLOSE_WAIT_S,
                        ", ".join(t.get_name() for t in pending))
        self._tasks.clear()
        for close in self.closers:
            await close()
