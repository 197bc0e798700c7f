"""W3C trace context through gRPC metadata, NATS headers and the mux streams' traceparent field, and the off path."""

from __future__ import annotations

import re

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.common import tracing

pytestmark = pytest.mark.unit

W3C = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-01$")
CLIENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"  # a caller's, as in the W3C spec


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    assert tracing.configure("test", env={}, exporter=exporter)
    yield exporter
    tracing.shutdown()


def test_off_unless_the_environment_names_a_collector():
    assert tracing.endpoint_from_env({}) == ""
    assert tracing.endpoint_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}) == "http://c:4317"
    assert tracing.endpoint_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317",
                                      "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:4317"}) == "http://t:4317"
    disabled = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_SDK_DISABLED": "true"}
    assert tracing.endpoint_from_env(disabled) == ""
    assert not tracing.configure("test", env={})
    assert not tracing.ENABLED


def test_the_off_path_adds_nothing():
    assert tracing.start_span("x", CLIENT) is None
    assert tracing.current_traceparent() == ""
    metadata = (("x-request-id", "r1"),)
    assert tracing.call_metadata(metadata) == metadata
    assert tracing.nats_headers({"a": "b"}) == {"a": "b"}
    with tracing.span("x") as s:
        assert s is None
    tracing.record_span("x", None, 0, 1)
    tracing.end_span(None)


def test_a_served_call_continues_the_callers_trace_and_hands_it_on_in_metadata(spans):
    with tracing.server_span("router Route", CLIENT, "mesh-1", edge=False) as server:
        outgoing = dict(tracing.call_metadata((("x-request-id", "mesh-1"),)))
        with tracing.span("route"):
            pass
    assert outgoing["x-request-id"] == "mesh-1"
    trace_id, span_id = W3C.match(outgoing["traceparent"]).groups()
    assert trace_id == CLIENT.split("-")[1]  # the caller's trace
    assert span_id == f"{server.get_span_context().span_id:016x}"  # with this call's span as the parent
    done = {s.name: s for s in spans.get_finished_spans()}
    assert done["router Route"].parent.span_id == int(CLIENT.split("-")[2], 16)
    assert done["route"].parent.span_id == done["router Route"].context.span_id
    assert done["router Route"].attributes[tracing.MESH_REQUEST_ID_ATTRIBUTE] == "mesh-1"
    assert tracing.from_metadata(tuple(outgoing.items())) == outgoing["traceparent"]


def test_the_edge_call_is_tagged_with_the_clients_request_id(spans):
    with tracing.server_span("gateway ChatCompletions", "", "client-id-7", edge=True):
        pass
    (span,) = spans.get_finished_spans()
    assert span.attributes[tracing.REQUEST_ID_ATTRIBUTE] == "client-id-7"
    assert span.parent is None  # no traceparent: a new trace


def test_a_message_field_carries_the_trace_across_a_multiplexed_stream(spans):
    """The postprocessor's span, opened from the request's traceparent field, parents the worker's recorded spans."""
    post = tracing.start_span("postprocess", CLIENT)
    onward = tracing.traceparent_of(post)
    worker = tracing.start_span("worker", onward, start_ns=1_000)
    tracing.record_span("worker.prefill", worker, 1_000, 2_000, {"meshfront.prompt_tokens": 3})
    tracing.end_span(worker, end_ns=3_000)
    tracing.end_span(post)
    done = {s.name: s for s in spans.get_finished_spans()}
    assert {s.context.trace_id for s in done.values()} == {int(CLIENT.split("-")[1], 16)}
    assert done["worker"].parent.span_id == done["postprocess"].context.span_id
    assert done["worker.prefill"].parent.span_id == done["worker"].context.span_id
    assert (done["worker.prefill"].start_time, done["worker.prefill"].end_time) == (1_000, 2_000)


def test_nats_headers_carry_the_current_trace(spans):
    with tracing.span("publish") as s:
        headers = tracing.nats_headers({"Nats-Rollup": "sub"})
    assert headers["Nats-Rollup"] == "sub"
    assert tracing.from_nats_headers(headers) == tracing.traceparent_of(s)
    assert tracing.from_nats_headers(None) == ""


def test_a_failed_call_marks_its_span(spans):
    with pytest.raises(ValueError), tracing.server_span("gateway X", "", "r", edge=True):
        raise ValueError("boom")
    (span,) = spans.get_finished_spans()
    assert not span.status.is_ok
