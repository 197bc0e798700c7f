"""What every routing policy is to the router: a chooser that also hears each request's lifecycle.

The router tells its policy, first among its lifecycle listeners (core/lifecycle.py), about every
booking, first token and release, its own and its replicas', and about every worker that leaves. A
policy that keeps per-request state (kv: the blocks and prefill each request holds) updates it
there; the stateless ones inherit ``Stateless``, which ignores both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from services.router.core.lifecycle import LifecycleEvent
from services.router.core.types import Candidate, Decision, RouteQuery


class Policy(Protocol):
    @property
    def wants_first_token(self) -> bool:
        """The policy ends a request's prefill when its first token arrives (kv): the router asks the
        gateway to report it (RouteResponse.report_first_token); others spare the gateway that message."""

    @property
    def reads_load(self) -> bool:
        """The choice weighs what is booked on each worker: router replicas must then share every booking
        (events.py ReplicaSync); a policy that does not spares them that."""

    @property
    def stats(self) -> dict[str, int]:
        """Counters of the policy's own decisions, exported as meshfront_router_kv_* (kv only)."""

    def choose(self, candidates: Sequence[Candidate], query: RouteQuery) -> Decision:
        """The worker for ``query`` among ``candidates`` (never empty)."""

    def on_lifecycle(self, event: LifecycleEvent, remote: bool) -> None:
        """A booking change, made by this router or (``remote``) a replica; both count alike."""

    def drop_worker(self, worker_id: str) -> None:
        """The worker left discovery: forget what the policy holds for it."""

    def overlaps(self, local_hashes: Sequence[int]) -> dict[str, int]:
        """Leading prompt blocks each worker is expected to hold (kv: its index and running requests);
        what the disaggregated pair choice weighs (services/router/disagg.py). Empty when unknown."""

    def active_blocks(self, worker_id: str) -> int | None:
        """KV blocks the worker's running requests hold (kv), or None when the policy does not track them."""


class Stateless:
    """For policies whose choice depends only on the candidates: nothing to track."""

    wants_first_token = False
    reads_load = False

    @property
    def stats(self) -> dict[str, int]:
        return {}

    def on_lifecycle(self, event: LifecycleEvent, remote: bool) -> None:
        pass

    def drop_worker(self, worker_id: str) -> None:
        pass

    def overlaps(self, local_hashes: Sequence[int]) -> dict[str, int]:
        return {}

    def active_blocks(self, worker_id: str) -> int | None:
        return None
