"""`meshfront trace`'s tree from Phoenix's span JSON (the shape of GET /v1/projects/{p}/spans)."""

from __future__ import annotations

import pytest

from services.launcher.envoy_config import OTLP_CLUSTER, render
from services.launcher.trace_cli import build_tree, parse_span, render_tree

pytestmark = pytest.mark.unit


def raw(span_id: str, parent: str | None, name: str, start_ms: int, end_ms: int, **attributes) -> dict:
    def at(ms: int) -> str:
        return f"2026-12-01T10:00:00.{ms:03d}000+00:00"
    return {"name": name, "context": {"trace_id": "t1", "span_id": span_id}, "parent_id": parent,
            "start_time": at(start_ms), "end_time": at(end_ms), "attributes": attributes}


def test_the_tree_nests_children_by_start_and_shows_durations_and_nested_attributes():
    spans = [parse_span(s) for s in (
        raw("c", "b", "route", 5, 7, meshfront={"worker_id": "w1"}),
        raw("a", None, "ingress", 0, 100),
        raw("d", "b", "postprocess", 8, 99),
        raw("b", "a", "gateway ChatCompletions", 1, 99, meshfront={"request_id": "r1"}),
        raw("e", "d", "worker.prefill", 10, 20, meshfront={"prompt_tokens": 12}),
    )]
    assert render_tree(build_tree(spans)).splitlines() == [
        "ingress  100.0 ms  (+0.0 ms)",
        "└─ gateway ChatCompletions  98.0 ms  (+1.0 ms)",
        "   ├─ route  2.0 ms  (+5.0 ms)  worker_id=w1",
        "   └─ postprocess  91.0 ms  (+8.0 ms)",
        "      └─ worker.prefill  10.0 ms  (+10.0 ms)  prompt_tokens=12",
    ]


def test_a_span_whose_parent_never_arrived_is_a_root():
    spans = [parse_span(raw("x", "missing", "worker", 0, 1))]
    assert [s.name for s in build_tree(spans)] == ["worker"]


def test_envoy_traces_only_when_given_a_collector():
    import yaml

    plain = yaml.safe_load(render(listen_host="127.0.0.1", listen_port=1, admin_port=2, gateways=[("127.0.0.1", 3)]))
    hcm = plain["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    assert "tracing" not in hcm
    assert hcm["preserve_external_request_id"] and hcm["always_set_request_id_in_response"]
    traced = yaml.safe_load(render(listen_host="127.0.0.1", listen_port=1, admin_port=2,
                                   gateways=[("127.0.0.1", 3)], otlp=("collector", 4317)))
    hcm = traced["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    assert hcm["tracing"]["provider"]["typed_config"]["grpc_service"]["envoy_grpc"]["cluster_name"] == OTLP_CLUSTER
    cluster = next(c for c in traced["static_resources"]["clusters"] if c["name"] == OTLP_CLUSTER)
    assert cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"] \
        == {"address": "collector", "port_value": 4317}
