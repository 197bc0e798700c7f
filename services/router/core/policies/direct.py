"""direct: the worker the client pinned (``x-worker-instance-id`` header or ``nvext.backend_instance_id``).

Parameters: none. A request without a pin is a client error in this mode.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.common.errors import InvalidRequest, NoWorkers
from services.router.core.policies.base import Stateless
from services.router.core.types import Candidate, Decision, RouteQuery


class Direct(Stateless):
    def choose(self, candidates: Sequence[Candidate], query: RouteQuery) -> Decision:
        if not query.pinned_worker_id:
            raise InvalidRequest("router mode 'direct' needs a worker id (x-worker-instance-id header)",
                                 param="nvext.backend_instance_id")
        for c in candidates:
            if c.worker_id == query.pinned_worker_id:
                return Decision(c.worker_id)
        raise NoWorkers(f"worker {query.pinned_worker_id} does not serve model {query.model}")
