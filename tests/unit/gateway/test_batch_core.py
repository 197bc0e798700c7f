"""The Batch API's pure core: input lines and their errors, the output and error files, the counts, and the
batch's state machine (services/gateway/batch/lines.py, state.py)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from services.common.errors import InvalidRequest
from services.gateway.batch import state
from services.gateway.batch.lines import (
    BATCH_PRIORITY,
    MAX_LINES,
    Outcome,
    counts,
    file_errors,
    lowest_priority,
    output_files,
    parse_input,
)

pytestmark = pytest.mark.unit

CHAT = "/v1/chat/completions"


def line(custom_id: str, body: dict | None = None, url: str = CHAT, **extra) -> bytes:
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": url,
                         "body": body if body is not None else {"model": "m", "messages": []}, **extra})


def test_good_lines_keep_their_order_and_bodies_and_blank_lines_are_skipped():
    data = b"\n".join([line("a"), b"", b"   ", line("b", {"model": "m", "prompt": "x"})]) + b"\n"
    lines = parse_input(data, CHAT)
    assert [(x.index, x.custom_id, x.error) for x in lines] == [(0, "a", None), (1, "b", None)]
    assert orjson.loads(lines[1].body) == {"model": "m", "prompt": "x"}


@pytest.mark.parametrize(("raw", "code", "custom_id"), [
    (b"{not json", "invalid_json", None),
    (b"[1, 2]", "invalid_json", None),
    (orjson.dumps({"method": "POST", "url": CHAT, "body": {}}), "missing_custom_id", None),
    (orjson.dumps({"custom_id": "", "method": "POST", "url": CHAT, "body": {}}), "missing_custom_id", None),
    (orjson.dumps({"custom_id": "x", "method": "GET", "url": CHAT, "body": {}}), "invalid_method", "x"),
    (line("x", url="/v1/embeddings"), "mismatched_url", "x"),
    (orjson.dumps({"custom_id": "x", "method": "POST", "url": CHAT, "body": "hi"}), "invalid_body", "x"),
    (line("x", {"model": "m", "stream": True}), "invalid_body", "x"),
    (line("x", extra="field"), "invalid_request", "x"),
])
def test_a_bad_line_fails_alone_with_openais_code_and_its_line_number(raw, code, custom_id):
    lines = parse_input(line("first") + b"\n" + raw + b"\n" + line("last"), CHAT)
    assert [x.error is None for x in lines] == [True, False, True]
    bad = lines[1]
    assert bad.error is not None and bad.error["code"] == code and bad.error["line"] == 2, bad.error
    assert bad.custom_id == custom_id and bad.body == b""


def test_a_repeated_custom_id_is_an_error_of_the_later_line_only():
    lines = parse_input(b"\n".join([line("a"), line("b"), line("a")]), CHAT)
    assert [x.error["code"] if x.error else None for x in lines] == [None, None, "duplicate_custom_id"]


def test_a_batch_line_never_jumps_the_queue():
    body: dict[str, Any] = {"model": "m", "nvext": {"agent_hints": {"priority": 100, "osl": 5}, "top_k": 3}}
    out = lowest_priority(CHAT, body)
    assert out["nvext"] == {"agent_hints": {"priority": BATCH_PRIORITY, "osl": 5}, "top_k": 3}
    assert body["nvext"]["agent_hints"]["priority"] == 100  # the caller's dict is not changed
    alias = lowest_priority(CHAT, {"nvext": {"agent_hints": {"latency_sensitivity": 9.0}}})
    assert alias["nvext"]["agent_hints"] == {"priority": BATCH_PRIORITY}
    assert lowest_priority(CHAT, {"model": "m"}) == {"model": "m"}  # no hint: the default, the lowest already
    parsed = parse_input(line("a", body), CHAT)[0]
    assert orjson.loads(parsed.body)["nvext"]["agent_hints"]["priority"] == BATCH_PRIORITY


def test_what_fails_a_whole_batch():
    assert file_errors(parse_input(b"\n\n", CHAT))[0]["code"] == "empty_file"
    many = parse_input(b"\n".join(line(str(i)) for i in range(MAX_LINES + 1)), CHAT)
    assert file_errors(many)[0]["code"] == "too_many_requests"
    assert file_errors(parse_input(line("a"), CHAT)) == []


def test_the_files_hold_one_line_per_input_line_and_the_counts_agree():
    lines = parse_input(b"\n".join([line("ok"), b"{bad", line("refused"), line("unrun")]), CHAT)
    done = {0: Outcome(200, {"id": "chatcmpl-1"}, "r0"),
            2: Outcome(404, {"error": {"message": "no model", "code": "model_not_found"}}, "r2")}
    out, err = output_files("batch_x", lines, done, "batch_cancelled")
    outputs = [orjson.loads(x) for x in out.splitlines()]
    errors = [orjson.loads(x) for x in err.splitlines()]
    assert [o["custom_id"] for o in outputs] == ["ok"]
    assert outputs[0]["response"] == {"status_code": 200, "request_id": "r0", "body": {"id": "chatcmpl-1"}}
    assert [e["custom_id"] for e in errors] == [None, "refused", "unrun"]
    assert errors[0]["error"]["code"] == "invalid_json" and errors[0]["response"] is None
    assert errors[1]["response"]["status_code"] == 404 and errors[1]["error"] is None
    assert errors[2]["error"]["code"] == "batch_cancelled"
    assert len({o["id"] for o in outputs + errors}) == 4
    again, _ = output_files("batch_x", lines, done, "batch_cancelled")
    assert again == out  # written again after a takeover: the same ids, the same bytes
    assert counts(lines, done) == {"total": 4, "completed": 1, "failed": 2}  # the unrun line: in neither
    _, expired = output_files("batch_x", lines, done, "batch_expired")
    assert orjson.loads(expired.splitlines()[-1])["error"]["code"] == "batch_expired"


def test_outcomes_survive_their_record():
    o = Outcome(400, {"error": {"message": "m"}}, "rid")
    assert Outcome.from_record(o.to_record()) == o and not o.ok


# ---- the batch's record and state machine --------------------------------------------------------------

def record(**changes) -> dict:
    r = state.new_record(tenant="t", key_id="k", input_file_id="file-1", endpoint=CHAT, window="24h",
                         metadata={"a": "b"}, now=1000.0, owner="me", lease_s=6)
    return {**r, **changes}


def test_a_new_batch_is_validating_and_shows_openais_fields_only():
    r = record()
    assert r["status"] == state.VALIDATING and r["expires_at"] == 1000 + 24 * 3600
    assert state.valid_id(r["id"]) and not state.valid_id("batch_../x")
    shown = state.public(r)
    assert set(shown) == set(state.PUBLIC) and "tenant" not in shown and "owner" not in shown


def test_create_bodies():
    assert state.parse_create(orjson.dumps({"input_file_id": "file-1", "endpoint": "/v1/embeddings",
                                            "completion_window": "24h"})) == ("file-1", "/v1/embeddings", "24h", None,
                                                                              None)
    assert state.parse_create(orjson.dumps({"input_file_id": "f", "endpoint": CHAT, "completion_window": "24h",
                                            "output_expires_after": {"anchor": "created_at", "seconds": 7200}}))[4] \
        == 7200
    for body, param in [({"endpoint": CHAT, "completion_window": "24h"}, "input_file_id"),
                        ({"input_file_id": "f", "endpoint": "/v1/moderations", "completion_window": "24h"}, "endpoint"),
                        ({"input_file_id": "f", "endpoint": CHAT, "completion_window": "48h"}, "completion_window"),
                        ({"input_file_id": "f", "endpoint": CHAT, "completion_window": "24h", "x": 1}, "x"),
                        ({"input_file_id": "f", "endpoint": CHAT, "completion_window": "24h",
                          "metadata": {"k": 1}}, "metadata.k"),
                        ({"input_file_id": "f", "endpoint": CHAT, "completion_window": "24h",
                          "output_expires_after": {"anchor": "created_at", "seconds": 60}},
                         "output_expires_after.seconds"),
                        ({"input_file_id": "f", "endpoint": CHAT, "completion_window": "24h",
                          "output_expires_after": {"anchor": "completed_at", "seconds": 7200}},
                         "output_expires_after.anchor")]:
        with pytest.raises(InvalidRequest) as e:
            state.parse_create(orjson.dumps(body))
        assert e.value.param == param, (body, e.value.message)
    assert state.window_s("90s") == 90 and state.window_s("30m") == 1800


def test_cancel_ending_and_final_changes():
    now = 2000.0
    assert state.cancel(record(status=state.IN_PROGRESS), now) == {"status": state.CANCELLING, "cancelling_at": 2000}
    assert state.cancel(record(status=state.CANCELLING), now) == {}  # again: nothing more to do
    assert state.cancel(record(status=state.FINALIZING), now) == {}  # every line ran: it finishes
    with pytest.raises(InvalidRequest):
        state.cancel(record(status=state.COMPLETED), now)
    assert state.ending(record(status=state.IN_PROGRESS), now) == ""
    assert state.ending(record(status=state.CANCELLING), now) == state.CANCELLED
    assert state.ending(record(status=state.IN_PROGRESS, expires_at=now), now) == state.EXPIRED
    final = state.final_changes(state.EXPIRED, now, "file-o", None, {"total": 3, "completed": 1, "failed": 0})
    assert final["status"] == state.EXPIRED and final["expired_at"] == 2000 and final["owner"] == ""
    assert final["lease_until"] == 0 and final["error_file_id"] is None
    failed = state.failed_changes([{"code": "empty_file"}], now)
    assert failed["errors"] == {"object": "list", "data": [{"code": "empty_file"}]} and failed["status"] == "failed"
