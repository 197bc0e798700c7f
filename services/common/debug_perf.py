"""``--dyn-debug-perf`` (Dynamo's flag, env ``DYN_DEBUG_PERF``): one log line per request and stage with the wall
and CPU time of the stage's own synchronous work for it.

Each stage logs its own part, keyed by the request id that every stage sees (the gateway's, ``-<i>`` per choice
when a request has several): the gateway (``parse``: the front end's start, ``render``: the response's bytes), the
preprocessor (``render_tokenize``, ``hash``), the router (``route``) and the postprocessor (``detokenize_parse``).
A line reads::

    perf request=8f2c... stage=preprocess wall_ms=1.92 cpu_ms=1.85 render_tokenize=1.40/1.38ms(1) hash=0.21/0.21ms(1)

``wall_ms`` is the stage's whole time for the request (the gateway's from its first byte in to its last out, so it
includes the other stages); each section is wall/CPU over its calls (count in brackets). CPU is
``time.thread_time``, measured around synchronous work only (in the thread that ran it, for work moved off the
event loop), so other requests' work on the same loop does not count; the router's ``route`` is the exception when
a request queued for a busy model (``--queue-timeout-s``): its CPU then includes what the loop did meanwhile.

Off (the default), the only cost is a check of ``ENABLED`` per request where a stage starts one (never per token):
set once at start-up (``configure``, from the common flag), read as a module global like ``tracing.ENABLED``.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

log = logging.getLogger("meshfront.perf")

T = TypeVar("T")

ENABLED = False

_current: contextvars.ContextVar[StagePerf | None] = contextvars.ContextVar("meshfront_debug_perf", default=None)


def configure(enabled: bool) -> None:
    """Turns the per-request lines on or off for this process (at start-up, from ``--dyn-debug-perf``)."""
    global ENABLED
    ENABLED = enabled


class StagePerf:
    """One request's timings in one stage: named sections, each its wall and CPU seconds and number of calls."""

    __slots__ = ("request_id", "sections", "stage", "started")

    def __init__(self, stage: str, request_id: str):
        self.stage = stage
        self.request_id = request_id
        self.started = time.perf_counter()
        self.sections: dict[str, list[float]] = {}  # name -> [wall s, cpu s, calls]

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - wall, time.thread_time() - cpu)

    def add(self, name: str, wall_s: float, cpu_s: float) -> None:
        acc = self.sections.setdefault(name, [0.0, 0.0, 0])
        acc[0] += wall_s
        acc[1] += cpu_s
        acc[2] += 1

    def line(self) -> str:
        cpu = sum(s[1] for s in self.sections.values())
        parts = [f"perf request={self.request_id} stage={self.stage} "
                 f"wall_ms={(time.perf_counter() - self.started) * 1e3:.2f} cpu_ms={cpu * 1e3:.2f}"]
        parts += [f"{name}={w * 1e3:.2f}/{c * 1e3:.2f}ms({n:.0f})" for name, (w, c, n) in self.sections.items()]
        return " ".join(parts)

    def log(self) -> None:
        log.info("%s", self.line())


@contextlib.contextmanager
def request(stage: str, request_id: str) -> Iterator[StagePerf]:
    """The request's record in ``stage`` for the code it runs (``timed`` adds to it), logged at the end. Only for
    code that runs in one task (not across an async generator's yields: use a ``StagePerf`` there)."""
    perf = StagePerf(stage, request_id)
    token = _current.set(perf)
    try:
        yield perf
    finally:
        _current.reset(token)
        perf.log()


@contextlib.contextmanager
def logged(stage: str, request_id: str) -> Iterator[StagePerf | None]:
    """A record for code that spans yields (an async generator's), logged at the end; None while off."""
    if not ENABLED:
        yield None
        return
    perf = StagePerf(stage, request_id)
    try:
        yield perf
    finally:
        perf.log()


def timed(section: str, fn: Callable[..., T]) -> Callable[..., T]:
    """``fn``, adding its wall and CPU to ``section`` of the current request's record (see ``request``) in the
    thread that runs it: a function moved to a thread (``asyncio.to_thread`` copies the context) is measured
    there. Without a record it is only called."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> T:
        perf = _current.get()
        if perf is None:
            return fn(*args, **kwargs)
        with perf.section(section):
            return fn(*args, **kwargs)
    return call
