"""The route span carries the decision record when the request asked for it, and only then."""

from __future__ import annotations

import json

import pytest
from meshfront.router.v1 import router_pb2

from services.router.route_trace import route_attributes

pytestmark = pytest.mark.unit


def test_the_decision_record_goes_on_the_route_span_when_asked():
    plain = route_attributes(router_pb2.RouteResponse(worker_id="w1", overlap_blocks=3))
    assert plain["meshfront.worker_id"] == "w1" and not any(k.startswith("meshfront.routing.") for k in plain)
    response = router_pb2.RouteResponse(worker_id="w1")
    response.decision.chosen_by = "policy"
    response.decision.predicted_cached_tokens = 48
    response.decision.candidates.add(worker_id="w1", overlap_blocks=3)
    response.decision.candidates.add(worker_id="w2", overlap_blocks=0)
    explained = route_attributes(response)
    assert explained["meshfront.routing.chosen_by"] == "policy"
    assert explained["meshfront.routing.predicted_cached_tokens"] == 48
    record = json.loads(explained["meshfront.routing.decision"])
    assert [c["workerId"] for c in record["candidates"]] == ["w1", "w2"]
