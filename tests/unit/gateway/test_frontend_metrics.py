"""The gateway's request metrics in both namings, and the edge's merge of every replica's families."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.common.errors import InvalidRequest, WorkerFailed
from services.gateway import request_metrics
from services.gateway.config import parse_config
from services.gateway.edge.exposition import render, snapshot
from services.gateway.frontend_metrics import DynamoRecorder, MeshfrontRecorder, Outcome, log_buckets

pytestmark = pytest.mark.unit


def value(recorder, name: str, **labels) -> float:
    return recorder.registry.get_sample_value(name, labels) or 0.0


def outcome(**kw) -> Outcome:
    base = {"model": "m", "endpoint": "chat", "stream": True, "status": "200", "reason": "", "started": True,
            "duration_s": 0.5, "prompt_tokens": 10, "completion_tokens": 5, "cached_tokens": 4, "itl_s": 0.01}
    return Outcome(**{**base, **kw})


def test_dynamo_labels_and_families():
    rec = DynamoRecorder("dyn")
    for o in (outcome(), outcome(stream=False, itl_s=None),
              outcome(status="200", reason="WORKER_FAILED"),  # failed after its first byte: still an error
              outcome(model="", status="400", reason="INVALID_REQUEST", started=False),
              outcome(status="499", reason="CANCELLED")):
        if o.started:
            rec.started(o.model)
        rec.ended(o)
    req = "dyn_requests_total"
    assert value(rec, req, model="m", endpoint="chat_completions", request_type="stream", status="success",
                 error_type="") == 1
    assert value(rec, req, model="m", endpoint="chat_completions", request_type="unary", status="success",
                 error_type="") == 1
    assert value(rec, req, model="m", endpoint="chat_completions", request_type="stream", status="error",
                 error_type="internal") == 1
    assert value(rec, req, model="", endpoint="chat_completions", request_type="stream", status="error",
                 error_type="validation") == 1
    assert value(rec, req, model="m", endpoint="chat_completions", request_type="stream", status="error",
                 error_type="cancelled") == 1
    assert value(rec, "dyn_output_tokens_total", model="m") == 10  # the two that completed
    assert value(rec, "dyn_input_sequence_tokens_sum", model="m") == 20
    assert value(rec, "dyn_cached_tokens_count", model="m") == 2
    assert value(rec, "dyn_inter_token_latency_seconds_count", model="m") == 1
    assert value(rec, "dyn_request_duration_seconds_count", model="m") == 4  # the refused one never ran
    assert value(rec, "dyn_inflight_requests", model="m") == 0


def test_ours_keeps_http_statuses_and_reasons():
    rec = MeshfrontRecorder("ours")
    rec.started("m")
    rec.ended(outcome())
    rec.ended(outcome(model="", status="400", reason="INVALID_REQUEST", started=False))
    assert value(rec, "ours_requests_total", model="m", endpoint="chat", stream="true", status="200") == 1
    assert value(rec, "ours_requests_total", model="", endpoint="chat", stream="true", status="400") == 1
    assert value(rec, "ours_errors_total", model="", reason="INVALID_REQUEST") == 1
    assert value(rec, "ours_output_tokens_total", model="m") == 5
    assert value(rec, "ours_output_sequence_tokens_count", model="m") == 1
    assert value(rec, "ours_cached_tokens_total", model="m") == 4


def test_tracker_records_one_outcome_per_request(monkeypatch):
    rec = DynamoRecorder("trk")
    monkeypatch.setattr(request_metrics, "recorder", lambda: rec)
    # A context manager: leaving the block closes the request's books, whatever ended it.
    with request_metrics.RequestTracker("completions") as ok:
        ok.start("m", stream=True)
        ok.first_token()
        ok.finish(7, 3, 0)
    with request_metrics.RequestTracker("chat") as bad:
        bad.fail(InvalidRequest("no", param="x"))
    with pytest.raises(asyncio.CancelledError), request_metrics.RequestTracker("chat") as gone:
        gone.start("m", stream=False)
        raise asyncio.CancelledError  # the client went away: neither finished nor failed
    with request_metrics.RequestTracker("chat") as mid:
        mid.start("m", stream=True)
        mid.first_token()
        mid.fail(WorkerFailed("lost"), mid_stream=True)
    assert value(rec, "trk_requests_total", model="m", endpoint="completions", request_type="stream",
                 status="success", error_type="") == 1
    assert value(rec, "trk_requests_total", model="", endpoint="chat_completions", request_type="unary",
                 status="error", error_type="validation") == 1
    assert value(rec, "trk_requests_total", model="m", endpoint="chat_completions", request_type="unary",
                 status="error", error_type="cancelled") == 1
    assert value(rec, "trk_requests_total", model="m", endpoint="chat_completions", request_type="stream",
                 status="error", error_type="internal") == 1
    assert value(rec, "trk_time_to_first_token_seconds_count", model="m") == 2
    assert value(rec, "trk_output_sequence_tokens_sum", model="m") == 3
    assert value(rec, "trk_inflight_requests", model="m") == 0


def test_log_buckets_are_dynamo_shaped():
    b = log_buckets(0.001, 480, 18)
    assert len(b) == 18 and b[0] == 0.001 and b[-1] == 480 and list(b) == sorted(b)


def test_metrics_prefix_flag_is_checked():
    assert parse_config(["--metrics-prefix", "dynamo_frontend"], env={}).metrics_prefix == "dynamo_frontend"
    assert parse_config([], env={}).metrics_prefix == "meshfront_gateway"
    with pytest.raises(ValueError, match="metrics-prefix"):
        parse_config(["--metrics-prefix", "9bad"], env={})


def test_render_merges_replicas_under_one_header_each():
    a, b = DynamoRecorder("mrg"), DynamoRecorder("mrg")
    for rec, n in ((a, 2), (b, 3)):
        for _ in range(n):
            rec.started("m")
            rec.ended(outcome())
    text = render([snapshot(b.registry, "gw-b:1"), snapshot(a.registry, "gw-a:1")]).decode()
    assert text.count("# TYPE mrg_requests_total counter") == 1
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    per_replica = {s.labels["gateway"]: s.value for s in fams["mrg_requests"].samples if s.name.endswith("_total")}
    assert per_replica == {"gw-a:1": 2, "gw-b:1": 3}
    assert fams["mrg_time_to_first_token_seconds"].samples == []  # no first token was recorded: no series
    buckets = [s for s in fams["mrg_request_duration_seconds"].samples if s.name.endswith("_bucket")]
    assert {s.labels["gateway"] for s in buckets} == {"gw-a:1", "gw-b:1"} and all("le" in s.labels for s in buckets)
