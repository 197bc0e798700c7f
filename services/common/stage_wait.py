"""Unary calls to a stage of the mesh that wait out its restart instead of failing at once.

A stage killed and restarted (``meshfront run``, Kubernetes) is back within a second or two. Without
this, every request in that gap failed with gRPC's UNAVAILABLE: a channel in reconnect backoff fails
new calls at once, and the call in flight at the kill fails with the broken connection. Here a call
waits for the channel to connect, for at most ``wait_s`` (the ``--stage-wait-s`` flag), and a call
that failed by transport (UNAVAILABLE without our ErrorInfo: the request may or may not have reached
the stage) is sent again once the stage is back, after a short pause (``RETRY_BACKOFF_S``). Preprocess
and Route are safe to repeat: the first is a pure function of the request, and Route books the request
id again, replacing the old booking.
A stage that stays away past the wait is ``StageUnavailable`` ("the router is unavailable"), with
what gRPC said in the log only.

Waiting is for the connection, never for the call: a Route may queue (``--queue-timeout-s``) and a
long prompt takes a while to tokenize, so the call itself has no deadline from here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from services.common.errors import StageUnavailable, from_rpc_error, ours_in

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_WAIT_S = 5.0
# A request is sent at most this many times: enough for a kill while it was in flight and a second
# one while it waited, few enough that a request which itself crashes the stage cannot crash it forever.
MAX_SENDS = 3
# The pause before a request goes again to a replica it just lost by transport, doubled at each such loss (bounded
# by the wait for a replica). A connection that is closing (the server cancelled its calls, its GOAWAY is on the
# way) can still read READY for a moment: sent again at once, a request spent every one of its sends on it in a
# burst and failed while the stage was restarting, the case the wait is for (tests/service/test_stage_wait.py,
# tests/service/postprocessor/test_resume_on_replica_loss.py).
RETRY_BACKOFF_S = 0.25


def connected(channel: grpc.aio.Channel) -> bool:
    """The channel has a live connection (asks it to connect when idle; cheap, no I/O here). For the request
    path, where a call follows: readiness asks ``Reachability``, which keeps idle channels idle."""
    return channel.get_state(try_to_connect=True) == grpc.ChannelConnectivity.READY


# How long an IDLE channel whose last connection was fine is taken for reachable without asking it to connect.
# A stage killed while the gateway had no call for it is found this late (plus the watch's grace); each check
# leaves the channel connected until its server closes it (15-33 s later, grpc_server.py): every 60 s, an idle
# gateway's stage channels are connected about a quarter of the time.
IDLE_CHECK_S = 60.0


class Reachability:
    """Whether a stage's channel reaches it, asked often (the gateway's readiness, stage_watch.py) and cheap.

    Mesh servers close a connection after a quiet spell (``grpc.max_connection_idle_ms``, grpc_server.py),
    and the channel reads IDLE then, as a pick-first channel also does when its peer went away. So IDLE
    counts as reachable while the last connection seen was fine (READY, with no connecting or failing
    since) and is at most ``check_every_s`` old; past that, or while the stage has not been reached yet, the
    channel is asked to connect, and the next polls see how that went. Asking at every poll, as before, kept
    every idle channel connected and its keepalive timer waking the gateway.
    """

    def __init__(self, channel: grpc.aio.Channel, check_every_s: float = IDLE_CHECK_S,
                 clock: Callable[[], float] = time.monotonic):
        self.channel = channel
        self._check_every_s = check_every_s
        self._clock = clock
        self._reached_at: float | None = None  # last seen READY
        self._lost = False  # seen connecting or failing since

    def unreachable(self) -> bool:
        state = self.channel.get_state(try_to_connect=False)
        if state == grpc.ChannelConnectivity.READY:
            self._reached_at, self._lost = self._clock(), False
            return False
        if state != grpc.ChannelConnectivity.IDLE:
            # Connecting or failing: away, or reconnecting for a call (a millisecond: the watch's grace covers it).
            self._lost = True
            return True
        fine_at = None if self._lost else self._reached_at  # when its last connection was seen fine
        if fine_at is None or self._clock() - fine_at >= self._check_every_s:
            self.channel.get_state(try_to_connect=True)
        return fine_at is None


async def wait_connected(channel: grpc.aio.Channel, timeout_s: float) -> bool:
    """Waits up to ``timeout_s`` for the channel to connect; whether it did."""
    if connected(channel):
        return True
    try:
        async with asyncio.timeout(max(timeout_s, 0.0)):
            await channel.channel_ready()
    except TimeoutError:
        return False
    return True


async def pause_before_resend(lost_here: int, deadline: float | None) -> None:
    """The pause before a send to the replica that lost this request ``lost_here`` times (none when 0)."""
    if lost_here:
        pause = RETRY_BACKOFF_S * 2 ** (lost_here - 1)
        await asyncio.sleep(pause if deadline is None else max(0.0, min(pause, deadline - time.monotonic())))


class StageCaller:
    """Calls one stage's unary RPCs over ``channel``, waiting up to ``wait_s`` for it to be reachable."""

    def __init__(self, channel: grpc.aio.Channel, stage: str, wait_s: float = DEFAULT_WAIT_S):
        self.channel = channel
        self.stage = stage
        self.wait_s = wait_s
        self._reach = Reachability(channel)

    def unreachable(self) -> bool:
        """For readiness (with replicas: none is reachable): see ``Reachability``."""
        return self._reach.unreachable()

    async def call(self, send: Callable[[], Awaitable[T]]) -> T:
        """``send()`` once the stage is connected; again after a transport failure, within the wait."""
        deadline: float | None = None
        for attempt in range(1, MAX_SENDS + 1):
            await pause_before_resend(attempt - 1, deadline)  # after a lost send: its connection may still read READY
            if not connected(self.channel):
                deadline = deadline if deadline is not None else time.monotonic() + self.wait_s
                if not await wait_connected(self.channel, deadline - time.monotonic()):
                    log.warning("the %s was unreachable for %.1f s", self.stage, self.wait_s)
                    raise StageUnavailable.of(self.stage)
            try:
                return await send()
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or ours_in(e) is not None:
                    raise from_rpc_error(e) from None  # the stage's own answer (or gRPC's, not a lost connection)
                log.warning("call to the %s failed (%s; send %d of %d): %s", self.stage, e.code().name, attempt,
                            MAX_SENDS, e.details())
                if deadline is None:  # counted from the failure: the stage may have died long after the request came
                    deadline = time.monotonic() + self.wait_s
        raise StageUnavailable.of(self.stage)
