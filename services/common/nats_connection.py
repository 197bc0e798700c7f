"""Connecting to NATS, and letting go of it, the same way in every service.

Every process (stages, gateway stores, workers, the router's event feeds) connects with unlimited
reconnects, waits for NATS when it starts first, retries opening a JetStream bucket while NATS restarts,
and closes its connection at shutdown without ever hanging the stop. Worker discovery
(services/common/discovery.py) is one user among many.

TLS: the process's start hands its one client context to ``use_tls`` (services/common/nats_tls.py makes it
from the ``--nats-tls-*`` flags); every later connection then speaks TLS and refuses a server that answers in
cleartext, as does a connection to a ``tls://`` URL. A TLS failure is logged as an error that names the flag
to fix, once per connection, while the connection keeps retrying (the server may get its certificate fixed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats
from nats.aio.client import Client as NatsClient
from nats.errors import NoServersError

from services.common.jetstream_replicas import nats_servers

log = logging.getLogger(__name__)
T = TypeVar("T")

# The process's TLS client context for NATS (None: cleartext unless a URL says tls://). A module setting made
# once at start, not a parameter: a process has one NATS identity, as it has one log configuration, and a
# dozen classes open NATS connections (discovery, the stores, the router's feeds, the worker's publisher);
# threading the context through all their constructors would carry one value that never differs among them.
_tls: ssl.SSLContext | None = None


class NatsTlsRefused(ConnectionError):
    """TLS is on, and the NATS server answered without offering it (no ``tls_required`` in its INFO)."""


class _QuietSslEof(logging.Filter):
    """Drops asyncio's "returning true from eof_received() has no effect when using ssl", logged at every close
    of a TLS connection by nats-py's transport (an asyncio StreamReaderProtocol, which returns True there to
    keep the socket half-open; under TLS asyncio just closes it, which is what a NATS close wants anyway)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "eof_received() has no effect when using ssl" not in record.getMessage()


_QUIET_SSL_EOF = _QuietSslEof()


def use_tls(context: ssl.SSLContext | None) -> None:
    """Every later ``connect`` of this process uses ``context``; called once at process start (service_main,
    the worker entry) after logging is set up."""
    global _tls
    _tls = context
    if context is not None and context.verify_mode == ssl.CERT_NONE:
        log.warning("TLS to NATS does not verify the server's certificate (--nats-tls-insecure): development only")


async def connect(url: str, name: str, *, no_echo: bool = False) -> nats.NATS:
    """Connects with unlimited reconnects so a NATS outage never kills a service. ``no_echo``: the server does
    not deliver this connection's own messages to its own subscriptions (a peer group on one subject).

    Raises:
        NatsTlsRefused: TLS is on (``use_tls``, a ``tls://`` URL) and the server offers none."""
    servers = nats_servers(url)
    reported: set[str] = set()

    async def on_error(e: Exception) -> None:
        if not isinstance(e, ssl.SSLError):
            log.warning("nats: %s", e)
            return
        # nats-py retries a failed handshake every half second, forever: the cause once as an error, then quietly.
        detail = e.verify_message if isinstance(e, ssl.SSLCertVerificationError) else ""
        text = f"nats: TLS with {url} failed: {e.reason or e}{f' ({detail})' if detail else ''}; {_tls_hint(e)}"
        log.log(logging.DEBUG if text in reported else logging.ERROR, text)
        reported.add(text)

    secure = _tls is not None or any(s.startswith("tls://") for s in servers)
    if secure:
        logging.getLogger("asyncio").addFilter(_QUIET_SSL_EOF)  # once: a filter is added only if absent
    nc = await nats.connect(servers, name=name, max_reconnect_attempts=-1, reconnect_time_wait=0.5,
                            connect_timeout=2, allow_reconnect=True, error_cb=on_error, no_echo=no_echo, tls=_tls)
    # nats-py upgrades to TLS only when the server asks for it: a server (or a man in the middle) that does not
    # would get this process's traffic in cleartext although TLS was asked for. The server's INFO says which.
    if secure and not nc._server_info.get("tls_required"):  # nats-py keeps INFO private
        await close_nats(nc)
        raise NatsTlsRefused(f"the NATS server at {url} does not offer TLS, which this process requires "
                             "(--nats-tls-* or a tls:// URL)")
    return nc


def _tls_hint(e: ssl.SSLError) -> str:
    """Which flag fixes a failed handshake."""
    if isinstance(e, ssl.SSLCertVerificationError):
        return ("the server's certificate is not trusted: --nats-tls-ca-cert-path (env NATS_TLS_CA_CERT_PATH) "
                "names the CA that signed it")
    if "ALERT_" in (e.reason or ""):  # the server's alert about our side: no client certificate, or one it distrusts
        return ("the server wants a client certificate it trusts: --nats-tls-client-cert-path and "
                "--nats-tls-client-key-path (env NATS_TLS_CLIENT_CERT_PATH, NATS_TLS_CLIENT_KEY_PATH)")
    return "check the --nats-tls-* flags against the server's TLS settings"


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
            log.log(logging.ERROR if isinstance(e, NatsTlsRefused) else logging.INFO, "waiting for NATS at %s (%s)",
                    url, e)
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
