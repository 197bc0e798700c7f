"""direct: the worker the client pinned (``x-worker-instance-id`` header or ``nvext.backend_instance_id``).

Parameters: none. A request without a pin is a client error in this mode. A pin naming a worker with
data-parallel ranks (services/router/dp_pins.py) and no rank goes to its least loaded admissible rank.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.common.errors import InvalidRequest, NoWorkers
from services.router.core.types import Candidate, Decision, RouteQuery

PIN_PARAM = "nvext.backend_instance_id"
# How much of a client's pin or model name an error echoes: enough to recognise it, never a flood.
_ECHO_CHARS = 64


def printable(value: str) -> str:
    """``value`` safe to echo in an error: control characters escaped (a pin comes from a JSON string, so
    it may hold any), and cut to a readable length."""
    cut = value[:_ECHO_CHARS] + ("..." if len(value) > _ECHO_CHARS else "")
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in cut)


def check_pin(pin: str, model: str, serving: Sequence[Candidate]) -> None:
    """A pin to a worker that does not serve the model is the client's mistake: a 400 naming the field.

    ``serving`` are all the model's workers, busy ones included (a busy pinned worker is not a mistake).
    """
    if not any(c.answers_to(pin) for c in serving):
        # The field only: the gateway names the x-worker-instance-id header instead where that set the pin.
        raise InvalidRequest(f"'{PIN_PARAM}' names worker {printable(pin)}, which does not serve model "
                             f"`{printable(model)}`", param=PIN_PARAM)


class Direct:
    reads_load = False

    def choose(self, candidates: Sequence[Candidate], query: RouteQuery) -> Decision:
        if not query.pinned_worker_id:
            raise InvalidRequest("router mode 'direct' needs a worker id (x-worker-instance-id header)",
                                 param=PIN_PARAM)
        pinned = [c for c in candidates if c.answers_to(query.pinned_worker_id)]
        if pinned:  # one, or the admissible data-parallel ranks of the pinned worker: the least loaded of them
            return Decision(min(pinned, key=lambda c: (c.in_flight, c.booked_prompt_tokens, c.worker_id)).worker_id)
        # The router checked the pin against every worker of the model (check_pin): this one serves it but
        # was left out of the candidates (busy, or already failed this request).
        raise NoWorkers(f"worker {printable(query.pinned_worker_id)} cannot take this request now")
