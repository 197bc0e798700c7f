"""A batch's record and its state machine: pure, no NATS.

OpenAI's lifecycle::

    validating -> in_progress -> finalizing -> completed
         |             |  \\-> (completion window over) -> finalizing -> expired
         |             \\-> cancelling (POST .../cancel) -> cancelled
         \\-> failed (nothing to run: no such file, empty, too many lines)

``cancelling`` turns into ``cancelled`` once the lines running at the cancel end; lines never started go to
the error file as ``batch_cancelled``. A window that ends first marks what was left ``batch_expired``.

The record holds what the client sees (``PUBLIC``) plus the gateway's bookkeeping: ``tenant`` (whose batch
it is), ``key_id`` (the key that made it, checked again before each line; never its secret), ``owner`` and
``lease_until`` (which gateway replica runs it, until when), ``ending`` (the final status once finalizing),
``created`` (the creation time to the microsecond, the list's order).
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from services.common.errors import InvalidRequest
from services.gateway.batch.lines import ENDPOINTS
from services.gateway.core.fields import INT64, Fields
from services.gateway.core.request import load_json

VALIDATING, IN_PROGRESS, FINALIZING = "validating", "in_progress", "finalizing"
COMPLETED, FAILED, EXPIRED = "completed", "failed", "expired"
CANCELLING, CANCELLED = "cancelling", "cancelled"
# A replica runs (or finishes) these; the rest are final.
ACTIVE = (VALIDATING, IN_PROGRESS, FINALIZING, CANCELLING)
FINAL = (COMPLETED, FAILED, EXPIRED, CANCELLED)
# What GET /v1/batches/{id} shows (OpenAI's Batch object).
PUBLIC = ("id", "object", "endpoint", "errors", "input_file_id", "completion_window", "status", "output_file_id",
          "error_file_id", "created_at", "in_progress_at", "expires_at", "finalizing_at", "completed_at",
          "failed_at", "expired_at", "cancelling_at", "cancelled_at", "request_counts", "metadata")
# completion_window: OpenAI takes "24h" only; shorter windows ("30m", "90s") are Meshfront's, for jobs that
# must be done sooner (and for tests of expiry). Never longer than a day.
_WINDOW = re.compile(r"^([1-9][0-9]{0,5})([smh])$")
MAX_WINDOW_S = 24 * 3600
_SECONDS = {"s": 1, "m": 60, "h": 3600}
_METADATA_PAIRS, _METADATA_KEY, _METADATA_VALUE = 16, 64, 512
_ID = re.compile(r"^batch_[0-9a-f]{32}$")


def valid_id(batch_id: str) -> bool:
    return bool(_ID.match(batch_id))


def window_s(window: str) -> int:
    """The completion window in seconds, or a 400 naming ``completion_window``."""
    m = _WINDOW.match(window)
    seconds = int(m.group(1)) * _SECONDS[m.group(2)] if m else 0
    if not 1 <= seconds <= MAX_WINDOW_S:
        raise InvalidRequest(f"'completion_window' must be 24h (or a shorter window such as 30m or 90s); "
                             f"got {window!r}", param="completion_window")
    return seconds


def _metadata(value: dict[str, Any] | None) -> dict[str, str] | None:
    if value is None:
        return None
    if len(value) > _METADATA_PAIRS:
        raise InvalidRequest(f"'metadata' takes at most {_METADATA_PAIRS} pairs", param="metadata")
    for k, v in value.items():
        if len(k) > _METADATA_KEY or not isinstance(v, str) or len(v) > _METADATA_VALUE:
            raise InvalidRequest(f"'metadata' keys are at most {_METADATA_KEY} characters and values strings of "
                                 f"at most {_METADATA_VALUE}", param=f"metadata.{k}"[:128])
    return value


# OpenAI's bounds on output_expires_after.seconds: an hour to 30 days (the files' own life here).
OUTPUT_EXPIRY_S = (3600, 30 * 24 * 3600)


def _output_expiry(value: dict[str, Any] | None) -> int | None:
    """``output_expires_after`` ({"anchor": "created_at", "seconds": N}): how long the output and error files
    live after they are written; None: the files' own TTL."""
    if value is None:
        return None
    f = Fields(value, "output_expires_after.")
    f.str("anchor", required=True, allowed=("created_at",))
    seconds = f.int("seconds", INT64, *OUTPUT_EXPIRY_S)
    if seconds is None:
        raise InvalidRequest("'output_expires_after.seconds' is required", param="output_expires_after.seconds")
    f.reject_unknown()
    return seconds


def parse_create(raw: bytes) -> tuple[str, str, str, dict[str, str] | None, int | None]:
    """POST /v1/batches: (input_file_id, endpoint, completion_window, metadata, output files' life in seconds or
    None), or a 400."""
    f = Fields(load_json(raw))
    input_file_id = f.required_str("input_file_id")
    endpoint = f.str("endpoint", required=True, allowed=ENDPOINTS)
    assert endpoint is not None
    window = f.required_str("completion_window")
    window_s(window)
    metadata = _metadata(f.obj("metadata"))
    output_expiry = _output_expiry(f.obj("output_expires_after"))
    f.reject_unknown()
    return input_file_id, endpoint, window, metadata, output_expiry


def new_record(*, tenant: str, key_id: str, input_file_id: str, endpoint: str, window: str,
               metadata: dict[str, str] | None, now: float, owner: str, lease_s: float,
               output_expiry_s: int | None = None) -> dict[str, Any]:
    """A new batch, ``validating``, leased to ``owner`` (the replica that accepted it runs it)."""
    return {
        "id": f"batch_{secrets.token_hex(16)}", "object": "batch", "endpoint": endpoint, "errors": None,
        "input_file_id": input_file_id, "completion_window": window, "status": VALIDATING,
        "output_file_id": None, "error_file_id": None, "created_at": int(now), "in_progress_at": None,
        "expires_at": int(now) + window_s(window), "finalizing_at": None, "completed_at": None, "failed_at": None,
        "expired_at": None, "cancelling_at": None, "cancelled_at": None,
        "request_counts": {"total": 0, "completed": 0, "failed": 0}, "metadata": metadata,
        "output_expiry_s": output_expiry_s,
        "tenant": tenant, "key_id": key_id, "owner": owner, "lease_until": now + lease_s, "attempts": 1, "created": now,
    }


def public(record: dict[str, Any]) -> dict[str, Any]:
    return {k: record[k] for k in PUBLIC}


def cancel(record: dict[str, Any], now: float) -> dict[str, Any]:
    """The changes a cancel makes: ``cancelling`` now (its runner finishes it), or a 400 for a final batch."""
    status = record["status"]
    if status in (CANCELLING, CANCELLED, FINALIZING):  # finalizing: every line has run; its files are on the way
        return {}
    if status in FINAL:
        raise InvalidRequest(f"Cannot cancel a batch with status {status!r}.", param="batch_id")
    return {"status": CANCELLING, "cancelling_at": int(now)}


def ending(record: dict[str, Any], now: float) -> str:
    """How a batch running now ends if it stops: ``cancelled``, ``expired``, or "" (it goes on)."""
    if record["status"] == CANCELLING:
        return CANCELLED
    if now >= record["expires_at"]:
        return EXPIRED
    return ""


def final_changes(final: str, now: float, output_file_id: str | None, error_file_id: str | None,
                  request_counts: dict[str, int]) -> dict[str, Any]:
    """The last write of a batch: its final status and time, its files, its counts; nobody holds it after."""
    return {"status": final, f"{final}_at": int(now), "output_file_id": output_file_id,
            "error_file_id": error_file_id, "request_counts": request_counts, "lease_until": 0, "owner": ""}


def failed_changes(errors: list[dict[str, Any]], now: float) -> dict[str, Any]:
    """A batch that cannot run at all (OpenAI's ``errors`` list)."""
    return {"status": FAILED, "failed_at": int(now), "errors": {"object": "list", "data": errors},
            "lease_until": 0, "owner": ""}
