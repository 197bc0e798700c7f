"""Sticky sessions: the requests of one session go to the worker its first request went to.

A session (``nvext.session_control.session_id``, or OpenAI's ``prompt_cache_key``) is bound to a
worker when one of its requests is booked, and lives until it has been idle for its timeout
(300 s unless the request says otherwise), until a request with ``action: close`` is released, or
until its worker leaves. While it lives, routing prefers that worker over whatever the policy would
pick, so a conversation's growing prefix stays in one KV cache; a worker that is busy or excluded
(a migration) is passed over for this request without ending the binding.

Bindings ride on the router's lifecycle events, so router replicas learn each other's (a client's
requests may reach any replica).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

DEFAULT_TIMEOUT_S = 300.0
# Bound on remembered sessions; the least recently used go first beyond it.
MAX_SESSIONS = 100_000


@dataclasses.dataclass
class _Session:
    worker_id: str
    timeout_s: float
    expires: float


class SessionAffinity:
    def __init__(self, clock: Callable[[], float] = time.monotonic, max_sessions: int = MAX_SESSIONS):
        self._clock = clock
        self._max = max_sessions
        self._sessions: dict[str, _Session] = {}  # insertion order = least recently used first
        self._closing: dict[str, str] = {}  # request id -> session to end when it is released

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
