"""Connecting to NATS, and letting go of it, the same way in every service.

Every process (stages, gateway stores, workers, the router's event feeds) connects with unlimited
reconnects, waits for NATS when it starts first, retries opening a JetStream bucket while NATS restarts,
and closes its connection at shutdown without ever hanging the stop. Worker discovery
(services/common/discovery.py) is one user among many.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats
from nats.aio.client import Client as NatsClient
from nats.errors import NoServersError

from services.common.jetstream_replicas import nats_servers

log = logging.getLogger(__name__)
T = TypeVar("T")


async def connect(url: str, name: str, *, no_echo: bool = False) -> nats.NATS:
    """Connects with unlimited reconnects so a NATS outage never kills a service. ``no_echo``: the server does
    not deliver this connection's own messages to its own subscriptions (a peer group on one subject)."""

    async def on_error(e: Exception) -> None:
        log.warning("nats: %s", e)

    return await nats.connect(nats_servers(url), name=name, max_reconnect_attempts=-1, reconnect_time_wait=0.5,
                              connect_timeout=2, allow_reconnect=True, error_cb=on_error, no_echo=no_echo)


def stop_if_cancelled() -> None:
    """For the ``except Exception`` of a loop that retries NATS until it works.

    nats-py swallows a cancel in places (a flush, a JetStream publish) or turns it into one of its
    own errors, so such a loop could outlive the cancel that was meant to end it and keep a stopping
    service alive until SIGKILL. The task still counts the cancel (``Task.cancelling``): honour it.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def connect_retrying(url: str, name: str, stop: asyncio.Event | None = None, *,
                           no_echo: bool = False) -> nats.NATS:
    """Keeps trying until NATS answers; services may start before it."""
    delay = 0.2
    while True:
        try:
            return await connect(url, name, no_echo=no_echo)
        except (NoServersError, OSError, asyncio.TimeoutError) as e:
            if stop is not None and stop.is_set():
                raise
            stop_if_cancelled()
            log.info("waiting for NATS at %s (%s)", url, e)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)


async def retry_until_open(open_it: Callable[[], Awaitable[T]], what: str) -> T:
    """Calls ``open_it`` until it succeeds: a JetStream bucket opened while NATS (re)starts. Meanwhile the
    requests that need it get a 503; a cancel (the service stopping) ends the wait."""
    delay = 0.2
    while True:
        try:
            return await open_it()
        except Exception as e:  # noqa: BLE001 - NATS restarting: retry
            stop_if_cancelled()
            log.warning("%s not ready (%s); retrying", what, e)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)


async def close_nats(nc: NatsClient | None, *, flush: bool = False) -> None:
    """Closes a NATS connection at shutdown, bounded, whatever state NATS is in.

    NATS may be going down at the same moment, so nothing here may fail or hang the shutdown: a failing
    close is nothing to report; its transport can cancel the close waiter it hands us (that
    CancelledError is not a cancel of this task, and it once ended workers with a traceback); and a
    close that hits a reconnect swallows cancellation, so ``asyncio.wait_for`` (which waits for the
    cancelled close to finish) could hang a stopping service for good. The close runs as its own task
    that is waited for at most two seconds and then abandoned (cancelled, not awaited).
    """
    if nc is None:
        return
    if flush and nc.is_connected:
        with contextlib.suppress(Exception):
            await nc.flush(timeout=1)
    closing = asyncio.ensure_future(nc.close())
    done, _ = await asyncio.wait({closing}, timeout=2.0)
    if not done:
        closing.cancel()
        log.debug("closing NATS did not finish in 2 s; left behind")
    elif not closing.cancelled() and closing.exception() is not None:
        log.debug("closing NATS: %r", closing.exception())


async def flush_in_order(nc: NatsClient) -> None:
    """``nc.flush()`` that returns only once the server has every command queued before it (a SUB).

    nats-py 2.16's flush writes its PING straight to the socket while the commands before it wait in the
    client's buffer for its flusher task, so the PONG can come back before the server has read a SUB queued
    earlier, and a message another connection publishes at that moment misses the subscription (core NATS
    keeps nothing): a router replica missed another's booking about one time in twenty on a busy machine.
    So: flush (which hands the buffer to the flusher), wait until the flusher has written it, and flush
    again, whose PING now goes out behind the SUB.
    """
    await nc.flush()
    while nc.pending_data_size and nc.is_connected:
        await asyncio.sleep(0)
    await nc.flush()
