"""Readiness that means servable: which stages the gateway cannot reach, for /health and gRPC health.

A request waits up to ``--stage-wait-s`` for an unreachable preprocessor, router or postprocessor
(services/common/stage_wait.py), so a stage restarting within that wait costs no request and the
gateway stays ready. A stage unreachable for longer fails the requests that need it: from then on
/health answers 503 and names it, and the gateway's gRPC health (what Envoy's active check and the
Kubernetes readiness probe ask) is NOT_SERVING, until the stage is back.

Each probe is a cheap local question (a channel's connectivity state, no RPC: stage_wait.Reachability); the
watch polls them every ``POLL_S`` while a stage is away (every ``STEADY_POLL_S`` while all are there) so that
/health only reads the last verdict. The probes leave an idle channel idle (its connection closed, so that an
idle gateway has no connection timers waking it) and take it for reachable when its last connection was
fine, checking it by a call every ``stage_wait.IDLE_CHECK_S``: a stage killed while the gateway had no
request for it turns the gateway unready that much later, plus the grace.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

log = logging.getLogger(__name__)

POLL_S = 0.25
# While every stage is reachable: a stage lost is seen at most this late, so a gateway turns unready at most
# this much past the grace. Polling at POLL_S all day was four wake-ups a second of an idle gateway.
STEADY_POLL_S = 1.0


class StageWatch:
    """``probes``: stage name -> "is it unreachable now?"; a stage is *unavailable* once it has been
    unreachable at every poll for ``grace_s``, and from the start until it has been reached once: the grace
    is for a stage restarting, and a gateway that starts before its stages (an engine's environment takes
    seconds to import) must not say it is ready while every request would wait for them."""

    def __init__(self, probes: Mapping[str, Callable[[], bool]], grace_s: float,
                 clock: Callable[[], float] = time.monotonic):
        self._probes = dict(probes)
        self._grace_s = grace_s
        self._clock = clock
        self._since: dict[str, float] = {}  # stage -> when it was first seen unreachable in a row
        self._reached: set[str] = set()  # stages seen reachable at least once
        self.unavailable: list[str] = []  # the last verdict, in the probes' order

    def poll(self) -> list[str]:
        """Asks every probe once and returns (and keeps) the stages unavailable now."""
        now = self._clock()
        verdict = []
        for stage, unreachable in self._probes.items():
            if not unreachable():
                self._since.pop(stage, None)
                self._reached.add(stage)
                continue
            since = self._since.setdefault(stage, now)
            if stage not in self._reached or now - since >= self._grace_s:
                verdict.append(stage)
        if verdict != self.unavailable:
            if verdict:
                log.warning("not ready: %s not reached yet or unreachable for %.1f s or more", ", ".join(verdict),
                            self._grace_s)
            else:
                log.info("ready again: every stage is reachable")
        self.unavailable = verdict
        return verdict

    async def run(self, set_serving: Callable[[bool], Awaitable[None]], may_serve: Callable[[], bool]) -> None:
        """Polls forever. While a stage is unavailable, ``set_serving(False)`` at every poll (so that
        nothing else marks the gateway serving meanwhile); once none is, ``set_serving(True)`` once,
        if ``may_serve()`` (warm, not draining: the server's own readiness)."""
        if not self._probes:
            return
        was_down = False
        while True:
            down = bool(self.poll())
            if down:
                await set_serving(False)
            elif was_down and may_serve():
                await set_serving(True)
            was_down = down
            await asyncio.sleep(POLL_S if self._since or down else STEADY_POLL_S)
