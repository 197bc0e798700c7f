"""A request's life as the router sees it: booked on a worker, first token (prefill done), freed.

Every change is one ``LifecycleEvent``. The router applies events to its bookings and sessions,
then tells its listeners (``Router.listeners``), in order: the kv policy when it is the one choosing
(it keeps each request's blocks and prefill; services/router/assembly.py ``kv_router`` subscribes it),
the LoRA placement's adapter counts, the telemetry, which compares the predicted overlap with the
cached tokens the worker reported, and the replica sync, which publishes the events this replica
made so that every other replica applies the same change (then all replicas hold the same load, and
a Release that lands on another replica still frees the booking). Listeners see the replicas'
events too, flagged ``remote``: the policy counts them as its own, and the replica that receives a
request's first-token report can score a prediction another replica made. A booking no decision
elsewhere reads (round-robin, no session, no adapter, no busy threshold) is not ``replicate``d: its
events stay on this replica, where the gateway sends its first token and release back.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

BOOK = "book"
FIRST_TOKEN = "first_token"  # noqa: S105 - a lifecycle event name, not a credential
FREE = "free"


@dataclasses.dataclass(frozen=True)
class LifecycleEvent:
    kind: str  # BOOK | FIRST_TOKEN | FREE
    request_id: str
    worker_id: str = ""
    model: str = ""
    local_hashes: tuple[int, ...] = ()
    prompt_tokens: int = 0
    overlap_blocks: int = 0
    overlap_tokens: int = 0  # predicted cached prompt tokens
    cached_tokens: int = 0  # reported by the worker (FIRST_TOKEN)
    # Sticky session of a BOOK (core/sessions.py); replicas bind it too.
    session_id: str = ""
    session_action: str = ""
    session_timeout_s: int = 0
    # BOOK: whether the other replicas need this booking (and then its first token and release). Not on the
    # wire: a booking another replica sent was replicated by definition.
    replicate: bool = True

    def to_wire(self, router_id: str) -> dict[str, Any]:
        # Field by field: dataclasses.asdict deep-copies the block hashes (~70 µs a request, bench/router_sync.py).
        d = {name: v for name in _WIRE_NAMES if (v := getattr(self, name)) not in ("", 0, ())}
        d["kind"] = self.kind
        d["request_id"] = self.request_id
        d["router_id"] = router_id
        return d

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> LifecycleEvent:
        kw = {k: v for k, v in d.items() if k in _WIRE_NAMES}
        if "local_hashes" in kw:
            kw["local_hashes"] = tuple(kw["local_hashes"])
        return cls(**kw)


_WIRE_NAMES = tuple(f.name for f in dataclasses.fields(LifecycleEvent) if f.name != "replicate")


class LifecycleListener(Protocol):
    def on_lifecycle(self, event: LifecycleEvent, remote: bool) -> None:
        """Called synchronously for each event, ``remote`` when a replica made it."""
