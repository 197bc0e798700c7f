"""nvext of a disaggregated request: ``worker_id`` names both workers and ``timing`` the KV transfer."""

from __future__ import annotations

import orjson
import pytest

from services.gateway.core.openai_request import parse_chat
from services.gateway.core.trace import RequestTrace
from services.gateway.openai.extensions import ResponseExtensions

pytestmark = pytest.mark.unit


def extensions() -> tuple[RequestTrace, ResponseExtensions]:
    req = parse_chat(orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                   "nvext": {"extra_fields": ["worker_id", "timing"]}}))
    trace = RequestTrace()
    return trace, ResponseExtensions(req.nvext, trace, "rid")


def test_both_workers_and_the_transfer_time_are_reported():
    trace, ext = extensions()
    trace.on_routed(0, "decode-1", 0, "prefill-1")
    assert ext.chunk_nvext(0, first=True, final=False) == {
        "worker_id": {"prefill_worker_id": "prefill-1", "decode_worker_id": "decode-1"}}
    trace.on_output(10, 0, False)  # the prefill leg's token
    assert ext.body_nvext()["timing"]["kv_transfer_ms"] is None  # not known before the decode leg's
    trace.on_output(0, 0, True, 0, "decode-1", "prefill-1", 12.5)  # the decode leg's first output
    body = ext.body_nvext()
    assert body["worker_id"] == {"prefill_worker_id": "prefill-1", "decode_worker_id": "decode-1"}
    assert body["timing"]["kv_transfer_ms"] == 12.5


def test_a_migration_names_the_new_pair_or_the_one_aggregated_worker():
    trace, ext = extensions()
    trace.on_routed(0, "decode-1", 0, "prefill-1")
    trace.on_output(10, 0, False, 0, "decode-2", "prefill-2", 3.0)  # moved to another pair
    assert ext.body_nvext()["worker_id"] == {"prefill_worker_id": "prefill-2", "decode_worker_id": "decode-2"}
    trace.on_output(0, 0, True, 0, "both-3")  # then to a worker that runs it whole
    assert ext.body_nvext()["worker_id"] == {"prefill_worker_id": "both-3", "decode_worker_id": "both-3"}


def test_an_aggregated_request_has_no_transfer_time():
    trace, ext = extensions()
    trace.on_routed(0, "w1", 0)
    trace.on_output(10, 0, True)
    body = ext.body_nvext()
    assert body["worker_id"] == {"prefill_worker_id": "w1", "decode_worker_id": "w1"}
    assert body["timing"]["kv_transfer_ms"] is None
