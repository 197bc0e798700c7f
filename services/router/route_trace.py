"""What the route span says about a decision (services/router/service.py opens it when tracing is on).

One function, so that the decision record (per candidate overlap, load and score; the choice; the
predicted cached tokens), when a request asked for it, goes on the span without touching the routing code.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from meshfront.router.v1 import router_pb2


def route_attributes(response: router_pb2.RouteResponse) -> dict[str, Any]:
    """The route span's attributes for the decision ``response`` carries."""
    attributes: dict[str, Any] = {
        "meshfront.worker_id": response.worker_id,
        "meshfront.overlap_blocks": response.overlap_blocks,
        "meshfront.queue_depth": response.queue_depth,
    }
    if response.prefill_worker_id:  # split: the prefill leg's worker, and why the request was split
        attributes["meshfront.prefill_worker_id"] = response.prefill_worker_id
        attributes["meshfront.prefill_overlap_blocks"] = response.prefill_overlap_blocks
        attributes["meshfront.disaggregation_reason"] = response.disaggregation_reason
    if response.HasField("decision"):  # the request asked for the decision record (nvext extra_fields "routing")
        decision = response.decision
        attributes["meshfront.routing.chosen_by"] = decision.chosen_by
        attributes["meshfront.routing.predicted_cached_tokens"] = decision.predicted_cached_tokens
        attributes["meshfront.routing.decision"] = json_format.MessageToJson(decision, indent=None)
    return attributes
