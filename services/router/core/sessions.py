"""Sticky sessions: the requests of one session go to the worker its first request went to.

A session (``nvext.session_control.session_id``, or OpenAI's ``prompt_cache_key``) is bound to a
worker when one of its requests is booked, and lives until it has been idle for its timeout
(300 s unless the request says otherwise), until a request with ``action: close`` is released, or
until its worker leaves. While it lives, routing prefers that worker over whatever the policy would
pick, so a conversation's growing prefix stays in one KV cache; a worker that is busy or excluded
(a migration) is passed over for this request without ending the binding.

Bindings ride on the router's lifecycle events, so router replicas learn each other's (a client's
requests may reach any replica).

Dynamo's header sessions (``X-Dynamo-Session-ID``, RouteRequest.affinity_session_id) are the same bindings
under Dynamo's rules: bound only when ``--router-session-affinity-ttl-secs`` is set (affinity is off when it is
omitted, as Dynamo's help says), for that idle life. ``--router-session-affinity-mode`` says what a binding
does when its worker is busy, for every session: ``soft`` (Meshfront's default) passes it over for this request
(a preference the policy may override), ``hard`` (Dynamo's default) keeps the request on it: it waits for the
worker in the router's queue (``--queue-timeout-s``) or fails with 503. A worker the request already failed
on (a migration) is passed over in both modes: the binding cannot bring it back.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

DEFAULT_TIMEOUT_S = 300.0
HARD, SOFT = "hard", "soft"
AFFINITY_MODES = (HARD, SOFT)
# Dynamo's bound on --router-session-affinity-ttl-secs (one year).
MAX_AFFINITY_TTL_S = 31_536_000
# Bound on remembered sessions; the least recently used go first beyond it.
MAX_SESSIONS = 100_000


@dataclasses.dataclass
class _Session:
    worker_id: str
    timeout_s: float
    expires: float


class SessionAffinity:
    """``affinity_ttl_s``: the idle life of header sessions (0: they are not bound); ``mode``: HARD or SOFT."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, max_sessions: int = MAX_SESSIONS,
                 affinity_ttl_s: int = 0, mode: str = SOFT):
        if mode not in AFFINITY_MODES:
            raise ValueError(f"session affinity mode {mode!r} is not one of {', '.join(AFFINITY_MODES)}")
        self._clock = clock
        self._max = max_sessions
        self.affinity_ttl_s = affinity_ttl_s
        self.hard = mode == HARD
        self._sessions: dict[str, _Session] = {}  # insertion order = least recently used first
        self._closing: dict[str, str] = {}  # request id -> session to end when it is released

    def key(self, session_id: str, affinity_session_id: str, timeout_s: int) -> tuple[str, int]:
        """The request's session and its idle timeout (0: the session's own): ``nvext.session_control`` or
        ``prompt_cache_key`` first, else the header's session while header affinity is on, else none ("")."""
        if session_id:
            return session_id, timeout_s
        if affinity_session_id and self.affinity_ttl_s:
            return affinity_session_id, self.affinity_ttl_s
        return "", 0

    def worker_for(self, session_id: str) -> str | None:
        """The live session's worker, or None."""
        s = self._sessions.get(session_id)
        if s is None:
            return None
        if s.expires <= self._clock():
            del self._sessions[session_id]
            return None
        return s.worker_id

    def bind(self, session_id: str, worker_id: str, timeout_s: float = 0.0) -> None:
        """A request of the session was booked on ``worker_id``: binds a new (or expired) session there,
        renews a live one (which keeps its worker even if this request was passed elsewhere).
        ``timeout_s`` 0 keeps the session's own timeout, or the default."""
        live = self.worker_for(session_id)
        old = self._sessions.pop(session_id, None)
        timeout = timeout_s or (old.timeout_s if old is not None else DEFAULT_TIMEOUT_S)
        worker = live if live is not None else worker_id
        self._sessions[session_id] = _Session(worker, timeout, self._clock() + timeout)
        while len(self._sessions) > self._max:
            del self._sessions[next(iter(self._sessions))]

    def close_after(self, request_id: str, session_id: str) -> None:
        """Ends the session once ``request_id`` is released (Dynamo defers a close until generation ends)."""
        self._closing[request_id] = session_id

    def on_release(self, request_id: str) -> None:
        session_id = self._closing.pop(request_id, None)
        if session_id is not None:
            self._sessions.pop(session_id, None)

    def drop_worker(self, worker_id: str) -> None:
        for sid in [sid for sid, s in self._sessions.items() if s.worker_id == worker_id]:
            del self._sessions[sid]

    def __len__(self) -> int:
        return len(self._sessions)
