"""Per-key quotas: one window per key, its counts, and the verdict on a new request. Pure: no NATS.

A key's state is one record (``QuotaState``) that every gateway replica reads and writes with a
compare-and-set on its revision (store.py), so two replicas never both admit the last request of a window:

- **window**: starts with the first request (or token charge) after the previous one ended and lasts
  ``WINDOW_S``; requests (rpm) and prompt plus completion tokens (tpm) count in it. A window that starts
  with the key's traffic, not on the minute, means a burst is never split across two windows: rpm=5 admits
  5 of 8 quick requests whenever they come.
- **tokens**: a request is admitted while the window's tokens are under tpm (its own tokens are not known
  yet); its prompt is charged once the prompt is tokenized, its completion as it streams (``gate.py``), so a
  window may end above tpm by what the requests in flight used, and the next request then waits for the
  window's reset.
- **concurrency**: each replica keeps its count of the key's requests in flight in ``slots``, stamped at
  every write; a replica that died holding slots is forgotten ``STALE_SLOT_S`` after its last write (a live
  replica rewrites its stamp at least once a second while a request of the key streams tokens).
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from typing import Any

import orjson

from services.gateway.auth.keys import KeyRecord

WINDOW_S = 60.0
STALE_SLOT_S = 600.0
# The retry-after of a refusal for concurrency: a slot frees when any request of the key ends.
CONCURRENCY_RETRY_S = 1


@dataclasses.dataclass
class QuotaState:
    window_start: float = 0.0
    requests: int = 0
    tokens: int = 0
    # replica id -> (requests in flight there, when that replica last wrote)
    slots: dict[str, tuple[int, float]] = dataclasses.field(default_factory=dict)

    def to_json(self) -> bytes:
        return orjson.dumps({"w": self.window_start, "n": self.requests, "t": self.tokens,
                             "c": {r: list(v) for r, v in self.slots.items()}})

    @classmethod
    def from_json(cls, data: bytes) -> QuotaState:
        raw: dict[str, Any] = orjson.loads(data)
        return cls(float(raw["w"]), int(raw["n"]), int(raw["t"]),
                   {r: (int(v[0]), float(v[1])) for r, v in raw.get("c", {}).items()})

    def rolled(self, now: float) -> QuotaState:
        """This state at ``now``: a new window if the last one ended, slots of dead replicas dropped."""
        slots = {r: v for r, v in self.slots.items() if v[0] > 0 and now - v[1] < STALE_SLOT_S}
        if now >= self.window_start + WINDOW_S:
            return QuotaState(now, 0, 0, slots)
        return QuotaState(self.window_start, self.requests, self.tokens, slots)

    def in_flight(self) -> int:
        return sum(n for n, _ in self.slots.values())

    def reset_s(self, now: float) -> float:
        return max(self.window_start + WINDOW_S - now, 0.0)

    def with_slot(self, replica: str, delta: int, now: float) -> None:
        held = self.slots.get(replica, (0, now))[0] + delta
        if held > 0:
            self.slots[replica] = (held, now)
        else:
            self.slots.pop(replica, None)


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """A key's limits and what is left of them, as the response headers tell it."""

    rpm: int
    requests_left: int
    tpm: int
    tokens_left: int
    reset_s: float


@dataclasses.dataclass(frozen=True)
class Refusal:
    """Why a request is refused: ``reason`` is ``requests``, ``tokens`` or ``concurrency``."""

    reason: str
    retry_after_s: int
    message: str
    quota: Snapshot


def snapshot(state: QuotaState, key: KeyRecord, now: float) -> Snapshot:
    return Snapshot(key.rpm, max(key.rpm - state.requests, 0), key.tpm, max(key.tpm - state.tokens, 0),
                    state.reset_s(now))


def admit(state: QuotaState, key: KeyRecord, replica: str, now: float) -> QuotaState | Refusal:
    """The state with one more request of ``key`` admitted on ``replica``, or why it is refused."""
    state = state.rolled(now)
    retry, left = max(1, math.ceil(state.reset_s(now))), snapshot(state, key, now)
    if key.rpm and state.requests >= key.rpm:
        return Refusal("requests", retry, f"Rate limit reached for requests per minute (RPM): limit {key.rpm}, "
                                          f"used {state.requests}. Please try again in {retry}s.", left)
    if key.tpm and state.tokens >= key.tpm:
        return Refusal("tokens", retry, f"Rate limit reached for tokens per minute (TPM): limit {key.tpm}, "
                                        f"used {state.tokens}. Please try again in {retry}s.", left)
    if key.max_concurrency and state.in_flight() >= key.max_concurrency:
        return Refusal("concurrency", CONCURRENCY_RETRY_S,
                       f"Too many concurrent requests: limit {key.max_concurrency}. Please try again when one ends.",
                       left)
    state.requests += 1
    state.with_slot(replica, 1, now)
    return state


def charged(state: QuotaState, tokens: int, replica: str, now: float, *, release: bool) -> QuotaState:
    """The state with ``tokens`` more used (in the window current at ``now``); ``release``: the request ended,
    its slot on ``replica`` is given back."""
    state = state.rolled(now)
    state.tokens += tokens
    state.with_slot(replica, -1 if release else 0, now)
    return state


def go_duration(seconds: float) -> str:
    """OpenAI's reset format: ``6m0s``, ``12s``, ``250ms``."""
    if seconds < 1:
        return f"{max(int(seconds * 1000), 0)}ms"
    whole = math.ceil(seconds)
    return f"{whole // 60}m{whole % 60}s" if whole >= 60 else f"{whole}s"


def openai_headers(s: Snapshot) -> tuple[tuple[str, str], ...]:
    """OpenAI's ``x-ratelimit-*`` headers for the limits a key has."""
    out: list[tuple[str, str]] = []
    for kind, limit, left in (("requests", s.rpm, s.requests_left), ("tokens", s.tpm, s.tokens_left)):
        if limit:
            out += [(f"x-ratelimit-limit-{kind}", str(limit)), (f"x-ratelimit-remaining-{kind}", str(left)),
                    (f"x-ratelimit-reset-{kind}", go_duration(s.reset_s))]
    return tuple(out)


def anthropic_headers(s: Snapshot, now: float) -> tuple[tuple[str, str], ...]:
    """Anthropic's ``anthropic-ratelimit-*`` headers (the reset is an RFC 3339 time)."""
    reset = datetime.datetime.fromtimestamp(math.ceil(now + s.reset_s), datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    out: list[tuple[str, str]] = []
    for kind, limit, left in (("requests", s.rpm, s.requests_left), ("tokens", s.tpm, s.tokens_left)):
        if limit:
            out += [(f"anthropic-ratelimit-{kind}-limit", str(limit)),
                    (f"anthropic-ratelimit-{kind}-remaining", str(left)),
                    (f"anthropic-ratelimit-{kind}-reset", reset)]
    return tuple(out)
