"""The front door's side of ``--auth``: which calls need a key, and one request's standing from its key to its end.

services/gateway/front_door.py runs every request's lifecycle; what ``--auth`` adds to it lives here, behind one
object per request (``Admission``) whose methods do nothing when the call needs no key, so the lifecycle never
branches on whether auth is on. The gate (gate.py) is one per gateway process, installed by the gateway's
assembly when ``--auth`` is on (``install``).

What needs no key: ``/health``, ``/live``, ``/metrics``, ``/openapi.json`` and ``/docs`` never reach the front
door; KServe's ServerLive and ServerReady are health probes, answered before it; ``OPEN_ENDPOINTS`` pass it; and a
batch line running in process (``BATCH_LINE``) was checked per line by ``batch_line``.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

from services.common.errors import MeshError
from services.gateway.auth.errors import RateLimited
from services.gateway.auth.gate import Api, Gate, Ticket
from services.gateway.auth.keys import KeyRecord

# True while a batch line runs in process (services/gateway/batch/inprocess.py sets it in the line's own task):
# its key was checked by ``batch_line`` and its tokens go to ``batch_usage``, so the front door lets it through.
# A gRPC call never carries it: each runs in a task of the server's, whose context this is never set in.
BATCH_LINE: contextvars.ContextVar[bool] = contextvars.ContextVar("batch_line", default=False)

# Requests that pass without a key: a generated image or video behind its URL (GET /v1/media/{id}), whose
# unguessable id is its credential (OpenAI's image URLs are signed the same way), so that the URL works where the
# key is not sent (an <img> tag, a browser, a client handed the URL).
OPEN_ENDPOINTS = frozenset({"media download"})

# The process's gate: the front door's RPC functions are bound into servicer classes at import, so they
# reach the gate here rather than through each servicer. One gateway per process; tests that build several
# without --auth install none.
_installed: list[Gate] = []


def install(gate: Gate | None) -> None:
    """Makes ``gate`` the process's (None: auth off)."""
    _installed[:] = [] if gate is None else [gate]


def installed() -> Gate | None:
    return _installed[0] if _installed else None


T = TypeVar("T")


class Admission:
    """One request's standing: its key's ticket once admitted, or none (no key needed); every method is a no-op
    or a yes without a ticket."""

    __slots__ = ("ticket",)

    def __init__(self, ticket: Ticket | None = None):
        self.ticket = ticket

    @property
    def record(self) -> KeyRecord | None:
        """The caller's key (None: no key needed)."""
        return None if self.ticket is None else self.ticket.record

    def visible(self, models: Mapping[str, T]) -> dict[str, T]:
        """The models the caller may see and use: all of them, or those of its key's ``--models``."""
        record = self.record
        return dict(models) if record is None else {name: v for name, v in models.items() if record.allows(name)}

    def check_model(self, model: str) -> None:
        """The 404 of an unknown model for one outside the key's ``--models`` (``Ticket.check_model``)."""
        if self.ticket is not None:
            self.ticket.check_model(model)

    def progress(self, prompt_tokens: int, completion_tokens: int) -> None:
        if self.ticket is not None:
            self.ticket.progress(prompt_tokens, completion_tokens)

    def headers(self) -> tuple[tuple[str, str], ...]:
        """The rate-limit headers a limited key's responses carry (none otherwise)."""
        return () if self.ticket is None else self.ticket.headers()

    def close(self, prompt_tokens: int = 0, completion_tokens: int = 0) -> None:
        """The request ended (however it did): its tokens charged, its concurrency slot freed."""
        if self.ticket is not None:
            self.ticket.close(prompt_tokens, completion_tokens)


# The standing of every call that needs no key (stateless, so one serves them all).
NO_KEY = Admission()


async def admit(endpoint: str, call_headers: Callable[[], Mapping[str, str]], api: Api, *,
                metered: bool) -> Admission:
    """Checks the key of a call of ``endpoint`` (``call_headers()``: the call's headers, read only when a key is
    needed) and, ``metered`` (a request that generates), its quotas. Raises ``Unauthenticated`` (401) or
    ``RateLimited`` (429)."""
    gate = installed()
    if gate is None or endpoint in OPEN_ENDPOINTS or BATCH_LINE.get():
        return NO_KEY
    return Admission(await gate.admit(call_headers(), api, metered=metered))


def error_headers(err: MeshError, api: Api, admission: Admission) -> tuple[tuple[str, str], ...]:
    """What an HTTP error carries for ``--auth``: a quota's retry-after and rate-limit headers, and the admitted
    key's own (a 404 or 400 after admission still tells a limited key what it has left)."""
    out = admission.headers()
    if isinstance(err, RateLimited):
        out = (("x-meshfront-retry-after", str(err.retry_after_s)), *api.rate_headers(err.quota, time.time()), *out)
    return out
