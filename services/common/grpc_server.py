"""Serving glue shared by every Meshfront gRPC server.

One place decides message limits, keepalive, health checking and how a
service drains on SIGTERM (mark NOT_SERVING, stop taking work, let in-flight
calls finish within a grace period, then exit).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.common import tls as mesh_tls
from services.common.error_interceptor import ErrorInterceptor
from services.common.gc_pauses import freeze_startup_heap, gc_pauses
from services.common.targets import split_target

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 << 20
MAX_METADATA_BYTES = 64 << 10

IDLE_CLOSE_MS = 15_000

# Prompts may be megabytes; the 4 MiB default would surface as RESOURCE_EXHAUSTED (a misleading 429).
SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
    # A connection with no call for this long is closed (GOAWAY), and its client connects again at its next
    # call (about 1 ms on loopback). A connected client channel keeps its transport's keepalive timer waking
    # its process even with no call (PINGED_CHANNEL_OPTIONS: every second), which was most of an idle mesh's
    # gRPC wake-ups (bench/idle.py). gRPC closes it between one and two of these after the last call (its
    # timer looks again a full period later when a call came meanwhile), plus 10 % jitter: 15-33 s, far above
    # the gap between a peer's calls under any load worth the name, and after a multiplexed stream's own idle
    # close (5 s, mux_client.py).
    # Closed here, not by the client's grpc.client_idle_timeout_ms: that one works once per channel (its
    # filter takes its own close for the channel's shutdown and never arms again: grpc/grpc#38454, 1.85),
    # where this runs per connection. A client whose balancer reconnects at once (round_robin) stays
    # connected, so a single-address target is not given one (channel_options).
    ("grpc.max_connection_idle_ms", IDLE_CLOSE_MS),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # Postprocessors ping workers every second to notice a frozen one (mux_client.py); a
    # stricter limit would answer those pings with GOAWAY and kill every stream on the connection.
    ("grpc.http2.min_ping_interval_without_data_ms", 500),
    # gRPC refuses metadata past 8 KiB at random and past 16 KiB always, as RESOURCE_EXHAUSTED (a 429
    # that SDKs retry). Envoy refuses request headers past 32 KiB itself, naming the header (the Lua
    # filter in deploy/envoy/envoy.yaml): everything it lets through, plus what it adds, must fit here.
    ("grpc.max_metadata_size", MAX_METADATA_BYTES),
    ("grpc.absolute_max_metadata_size", MAX_METADATA_BYTES),
]

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # Dead peers must be noticed quickly so streams fail (and migrate) instead of hanging.
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.enable_retries", 0),
    # A restarted peer (the launcher restarts within a second or two) is reached again promptly,
    # instead of on gRPC's default schedule of 1, 2.6, 5.2 s ... after the connection was lost. Half
    # a second at most: a waiting request would otherwise sit up to a second after the peer listens
    # again, and a refused loopback or pod connect costs next to nothing.
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 500),
]

# For a peer whose calls another can take over: workers (their streams migrate), router and
# postprocessor replicas (the gateway asks or resumes on another). A frozen peer (SIGSTOP, a wedged
# host) keeps its TCP connection open and simply stops talking. Pinging every second and giving up
# 2 s later fails its calls within ~3 s instead of leaving them hanging; pings go on while a call
# waits with no data either way (a long prefill, a Route queued for a busy model).
PINGED_CHANNEL_OPTIONS = [
    *(o for o in CHANNEL_OPTIONS if o[0] not in ("grpc.keepalive_time_ms", "grpc.keepalive_timeout_ms",
                                                 "grpc.keepalive_permit_without_calls")),
    ("grpc.keepalive_time_ms", 1_000),
    ("grpc.keepalive_timeout_ms", 2_000),
    # Only while a call is open: a frozen peer matters to the calls it holds, and a new call's own ping
    # (ping_timeout_ms below) finds it as fast. Pinging idle channels every second was most of an idle
    # mesh's wake-ups (bench/idle.py); multiplexed streams close when idle for this (mux_client.py). Even
    # not pinging, a connected transport's keepalive timer fires every keepalive_time_ms to see whether it
    # should (4 idle channels: 19 wake-ups/s against 4 once closed), so servers close idle connections
    # (max_connection_idle_ms, SERVER_OPTIONS), and a new call connects again, its connection attempt bounded
    # as a ping is (min_reconnect_backoff_ms below).
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 0),
    # A ping already out (gRPC's own, sent with a call's first bytes to size its window) stands in for
    # the keepalive one, under this timeout: 60 s by default, which kept a call to a frozen peer
    # waiting a minute whatever keepalive_timeout_ms says.
    ("grpc.http2.ping_timeout_ms", 2_000),
    # The deadline of a connection attempt (gRPC's name for it; 20 s by default). A request after a quiet
    # spell finds its channels unconnected (max_connection_idle_ms): a frozen peer accepts the TCP connection
    # in its kernel but never answers the HTTP/2 handshake, and the call waited 20 s for it, where on a
    # connected channel its ping fails it in 2 s. Backoff between attempts stays as set above.
    ("grpc.min_reconnect_backoff_ms", 2_000),
]


def spread_options(target: str) -> list[tuple[str, object]]:
    """PINGED_CHANNEL_OPTIONS for a target that may name several replicas ("ipv4:a:1,b:2", a DNS name with
    many addresses): round robin over them. Not for one literal address, where there is nothing to spread
    and round robin reconnects at once whenever the server closes the idle connection (SERVER_OPTIONS), so
    that the channel stays connected and its keepalive timer keeps waking the process."""
    fixed, dns = split_target(target)
    if dns is None and len(fixed) == 1:
        host = fixed[0].removeprefix("ipv4:").removeprefix("ipv6:").rsplit(":", 1)[0].strip("[]")
        try:
            ipaddress.ip_address(host)
            return list(PINGED_CHANNEL_OPTIONS)
        except ValueError:
            pass  # a name: it may resolve to several addresses
    return [*PINGED_CHANNEL_OPTIONS, ("grpc.lb_policy_name", "round_robin")]


def install_uvloop() -> None:
    """uvloop cuts grpc.aio CPU per message by 10-25 % (measured, mesh-cost.md)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a pinned dependency
        return
    uvloop.install()


def setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


SLOW_HOOK_S = 3.0


class GrpcServer:
    """A grpc.aio server with health checking and graceful drain."""

    def __init__(self, name: str, host: str, port: int, grace_s: float = 10.0,
                 tls: mesh_tls.MeshTls | None = None):
        self.name = name
        self.server = grpc.aio.server(options=SERVER_OPTIONS, interceptors=[ErrorInterceptor(name)])
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        # tls: None = cleartext; with a CA, clients must present a certificate it signed (mTLS).
        self.port = mesh_tls.add_port(self.server, f"{host}:{port}", tls)
        self.host = host
        self.grace_s = grace_s
        self._on_drain: list[Callable[[], Awaitable[None]]] = []
        self._on_stopped: list[Callable[[], Awaitable[None]]] = []
        self._gates: list[Callable[[], Awaitable[object]]] = []
        self._gate_task: asyncio.Task | None = None
        self._stop = asyncio.Event()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def on_drain(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Runs ``hook`` when draining starts (before the server stops accepting calls)."""
        self._on_drain.append(hook)

    def on_stopped(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Runs ``hook`` once in-flight calls have finished (closing clients they used)."""
        self._on_stopped.append(hook)

    def ready_when(self, gate: Callable[[], Awaitable[object]]) -> None:
        """Health stays NOT_SERVING after start until ``gate`` returns (warm-ups): probes send no traffic."""
        self._gates.append(gate)

    async def start(self) -> None:
        await self.server.start()
        if self._gates:
            await self.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
            self._gate_task = asyncio.create_task(self._serve_when_ready(), name=f"{self.name}-ready")
        else:
            await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        log.info("%s listening on %s", self.name, self.address)

    async def _serve_when_ready(self) -> None:
        await asyncio.gather(*(gate() for gate in self._gates))
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        log.info("%s ready", self.name)

    async def stop(self) -> None:
        if self._gate_task is not None:
            self._gate_task.cancel()
        await self.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        loop = asyncio.get_running_loop()
        for hook in self._on_drain:
            await hook()
        started = loop.time()
        await self.server.stop(self.grace_s)
        if self.grace_s and loop.time() - started >= self.grace_s - 0.1:
            log.warning("%s: calls still running after the %.0f s drain grace were cancelled", self.name, self.grace_s)
        for hook in self._on_stopped:
            started = loop.time()
            await hook()
            if loop.time() - started > SLOW_HOOK_S:  # every hook is bounded; name the one that was slow
                log.warning("%s: stopping %r took %.1f s", self.name, hook, loop.time() - started)
        log.info("%s stopped", self.name)

    async def serve_until_signal(self) -> None:
        """Starts, waits for SIGTERM or SIGINT, then drains and stops."""
        await self.start()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        # What start-up made stays alive: out of the collector's reach, a full collection pauses every stream
        # this process carries for a few ms instead of tens (gc_pauses.py).
        gc_pauses()
        freeze_startup_heap()
        # Printed for launchers and tests that start with --port 0.
        print(f"READY {self.name} {self.address}", flush=True)
        await self._stop.wait()
        await self.stop()

    def request_stop(self) -> None:
        """Drains and stops as on SIGTERM (a worker whose engine died stops itself this way)."""
        self._stop.set()


# How long a stopped process waits for the tasks it still has to honour their cancel.
LEFTOVER_WAIT_S = 2.0


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Runs ``main`` on a fresh (uv)loop, then ends the process's leftover tasks, bounded.

    Not ``asyncio.run``: its clean-up waits without a bound for every leftover task to finish its
    cancel, and a library task can swallow one (a NATS client reconnecting to a NATS that stopped with
    the mesh), which kept a drained, stopped service alive until its SIGKILL. Such tasks are named in the
    log and left behind instead.
    """
    install_uvloop()
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(main())
    finally:
        try:
            loop.run_until_complete(_end_leftovers(LEFTOVER_WAIT_S))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


async def _end_leftovers(wait_s: float) -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    if not tasks:
        return
    for task in tasks:
        task.cancel()
    done, pending = await asyncio.wait(tasks, timeout=wait_s)
    for task in done:  # retrieved, so that a failure at shutdown is not reported again at collection
        if not task.cancelled() and task.exception() is not None:
            log.debug("task %s ended with %r at shutdown", task.get_name(), task.exception())
    if pending:
        log.warning("stopping: %d task(s) did not end within %.0f s of their cancel and are left behind: %s",
                    len(pending), wait_s, "; ".join(f"{t.get_name()} {t.get_coro()!r}" for t in pending))
