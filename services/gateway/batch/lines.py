"""A batch's input file, line by line, and its output and error files: pure, no NATS, no mesh.

The input is JSONL: one request per non-blank line, ``{"custom_id": ..., "method": "POST", "url": <the
batch's endpoint>, "body": {...}}``. OpenAI fails a whole batch at validation for a bad line; here a bad line
fails alone, as its own line of the error file (``invalid_json``, ``missing_custom_id``, ...), so every input
line has exactly one line in the output or the error file, keyed by ``custom_id``. What fails the whole batch
is what leaves nothing to run: an empty file, or one past ``MAX_LINES`` (``file_errors``).

A line's body runs as the endpoint's request would over HTTP. A batch line runs in the router's lowest policy
class (services/gateway/scheduling.py ``batch_line``; services/router/core/wait_queue.py), and never jumps
the queue within it: a priority a line asks for (``nvext.agent_hints.priority``, seconds a request jumps the
queue) is replaced by ``BATCH_PRIORITY`` (``lowest_priority``).
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import orjson

# The endpoints a batch runs (OpenAI's, less /v1/moderations which the mesh does not serve).
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
# Endpoints whose bodies take Dynamo's nvext (the priority hint lives there).
_NVEXT_ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
# OpenAI's limit on requests per batch.
MAX_LINES = 50_000
MAX_CUSTOM_ID = 512
# The batch class: no jump ahead of anything in the router's queue (negative priorities count as 0 there).
BATCH_PRIORITY = 0


@dataclasses.dataclass(frozen=True)
class Line:
    """One input line: its place (0-based, among non-blank lines), its id, and its request or why it has none."""

    index: int
    custom_id: str | None
    body: bytes = b""  # the request body to run (JSON), when ``error`` is None
    error: dict[str, Any] | None = None  # {"code", "message", "line"}: the line is not run


def _bad(index: int, line_no: int, code: str, message: str, custom_id: str | None = None) -> Line:
    return Line(index, custom_id, error={"code": code, "message": message, "line": line_no})


def lowest_priority(endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with any priority hint it gives set to ``BATCH_PRIORITY`` (a batch line never jumps the queue)."""
    if endpoint not in _NVEXT_ENDPOINTS:
        return body
    nvext = body.get("nvext")
    hints = nvext.get("agent_hints") if isinstance(nvext, dict) else None
    if not isinstance(hints, dict) or not ({"priority", "latency_sensitivity"} & hints.keys()):
        return body
    hints = {k: v for k, v in hints.items() if k != "latency_sensitivity"}  # the deprecated alias of priority
    hints["priority"] = BATCH_PRIORITY
    assert isinstance(nvext, dict)
    return {**body, "nvext": {**nvext, "agent_hints": hints}}


def _line(raw: bytes, index: int, line_no: int, endpoint: str, seen: set[str]) -> Line:  # noqa: PLR0911 - one per check
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        return _bad(index, line_no, "invalid_json", f"Line {line_no} is not valid JSON: {e}")
    if not isinstance(obj, dict):
        return _bad(index, line_no, "invalid_json", f"Line {line_no} must be a JSON object")
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return _bad(index, line_no, "missing_custom_id", f"Line {line_no} has no custom_id (a non-empty string)")
    if len(custom_id) > MAX_CUSTOM_ID:
        return _bad(index, line_no, "invalid_custom_id",
                    f"Line {line_no}: custom_id is longer than {MAX_CUSTOM_ID} characters", custom_id[:MAX_CUSTOM_ID])
    if custom_id in seen:
        return _bad(index, line_no, "duplicate_custom_id",
                    f"Line {line_no}: custom_id {custom_id!r} is used by an earlier line; each must be unique",
                    custom_id)
    seen.add(custom_id)
    unknown = sorted(obj.keys() - {"custom_id", "method", "url", "body"})
    if unknown:
        return _bad(index, line_no, "invalid_request", f"Line {line_no}: unknown field {unknown[0]!r}", custom_id)
    if obj.get("method") != "POST":
        return _bad(index, line_no, "invalid_method", f"Line {line_no}: method must be POST", custom_id)
    if obj.get("url") != endpoint:
        return _bad(index, line_no, "mismatched_url",
                    f"Line {line_no}: url must be the batch's endpoint {endpoint}; got {obj.get('url')!r}", custom_id)
    body = obj.get("body")
    if not isinstance(body, dict):
        return _bad(index, line_no, "invalid_body", f"Line {line_no}: body must be a JSON object", custom_id)
    if body.get("stream") not in (None, False):
        return _bad(index, line_no, "invalid_body",
                    f"Line {line_no}: a batch answers whole responses; body.stream must be false or absent",
                    custom_id)
    return Line(index, custom_id, orjson.dumps(lowest_priority(endpoint, body)))


def parse_input(data: bytes, endpoint: str) -> list[Line]:
    """Every non-blank line of an input file, checked; a bad one carries its ``error`` instead of a body."""
    seen: set[str] = set()
    lines: list[Line] = []
    for line_no, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        lines.append(_line(raw, len(lines), line_no, endpoint, seen))
        if len(lines) > MAX_LINES:
            break
    return lines


def file_errors(lines: list[Line]) -> list[dict[str, Any]]:
    """Why a whole batch fails at validation (OpenAI's ``errors.data`` entries); [] when it can run."""
    if not lines:
        return [{"code": "empty_file", "message": "The input file has no requests.", "param": "input_file_id",
                 "line": None}]
    if len(lines) > MAX_LINES:
        return [{"code": "too_many_requests", "param": "input_file_id", "line": None,
                 "message": f"The input file has more than {MAX_LINES} requests; split it into several batches."}]
    return []


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How one line ended: the endpoint's HTTP status and JSON body (``request_id``: the gateway's id for it)."""

    status_code: int
    body: dict[str, Any]
    request_id: str

    @property
    def ok(self) -> bool:
        return 200 <= self.status_code < 300

    def to_record(self) -> bytes:
        return orjson.dumps({"status_code": self.status_code, "body": self.body, "request_id": self.request_id})

    @classmethod
    def from_record(cls, data: bytes) -> Outcome:
        r = orjson.loads(data)
        return cls(r["status_code"], r["body"], r["request_id"])


def _result_id(batch_id: str, index: int) -> str:
    """The same id however often the files are written (a batch finalized again after a takeover)."""
    return "batch_req_" + hashlib.sha256(f"{batch_id}:{index}".encode()).hexdigest()[:32]


def output_files(batch_id: str, lines: list[Line], done: dict[int, Outcome], unrun_code: str) -> tuple[bytes, bytes]:
    """(output JSONL, error JSONL), in input order: one line for every input line.

    A line that ran with a 2xx goes to the output file; one that ran with an error status, one that was
    bad, and one that never ran (``unrun_code``: ``batch_cancelled`` or ``batch_expired``) to the error file.
    """
    out: list[bytes] = []
    err: list[bytes] = []
    unrun = {"batch_cancelled": "This request was not executed: the batch was cancelled.",
             "batch_expired": "This request could not be executed before the completion window expired."}
    for line in lines:
        rid = _result_id(batch_id, line.index)
        outcome = done.get(line.index)
        if outcome is not None:
            record = {"id": rid, "custom_id": line.custom_id,
                      "response": {"status_code": outcome.status_code, "request_id": outcome.request_id,
                                   "body": outcome.body}, "error": None}
            (out if outcome.ok else err).append(orjson.dumps(record))
        else:
            error = line.error or {"code": unrun_code, "message": unrun.get(unrun_code, unrun_code)}
            err.append(orjson.dumps({"id": rid, "custom_id": line.custom_id, "response": None, "error": error}))
    return (b"\n".join(out) + b"\n" if out else b""), (b"\n".join(err) + b"\n" if err else b"")


def counts(lines: list[Line], done: dict[int, Outcome]) -> dict[str, int]:
    """OpenAI's ``request_counts``: completed (2xx), failed (an error status, or a bad line), of total.

    A line that did not run (cancelled, expired) is in neither count; it is in the error file.
    """
    completed = sum(1 for o in done.values() if o.ok)
    failed = len(done) - completed + sum(1 for line in lines if line.error is not None)
    return {"total": len(lines), "completed": completed, "failed": failed}
