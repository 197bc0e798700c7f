"""The one table that renders a domain error in the Anthropic API's shape and status.

Anthropic's body is ``{"type": "error", "error": {"type": ..., "message": ...}}`` and its statuses
differ from OpenAI's for the server side: an overloaded service is 529 (``overloaded_error``), which
the ``anthropic`` SDK retries, and there is no 503. So every "no capacity right now" error of the
mesh (a full queue, no live worker) is a 529 here, a broken worker or a bug a 500 ``api_error``.
Client mistakes keep their 4xx. The message names the offending field, since Anthropic's body has
no ``param``.
"""

from __future__ import annotations

import json

from services.common.errors import Cancelled, MeshError, NoWorkers, Overloaded

# HTTP status -> Anthropic error type (https://docs.claude.com/en/api/errors).
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
          529: "overloaded_error"}
OVERLOADED_STATUS = 529


def http_status(err: MeshError) -> int:
    """The status Anthropic's API would answer ``err`` with."""
    if isinstance(err, (Overloaded, NoWorkers)):
        return OVERLOADED_STATUS
    if isinstance(err, Cancelled):
        return err.http_status  # the client is gone; only logs and metrics see it
    if 400 <= err.http_status < 500:
        return err.http_status
    return 500


def error_type(status: int) -> str:
    if status in _TYPES:
        return _TYPES[status]
    return "invalid_request_error" if 400 <= status < 500 else "api_error"


def error_body(err: MeshError) -> bytes:
    # ASCII-only: the same bytes travel in a gRPC trailer (Envoy's Lua filter lifts it into the HTTP body).
    return json.dumps({"type": "error", "error": {"type": error_type(http_status(err)), "message": err.message}},
                      ensure_ascii=True).encode()


def sse_error_event(err: MeshError) -> bytes:
    """A mid-stream failure: the status is already 200, so it travels as Anthropic's ``error`` event."""
    return b"event: error\ndata: " + error_body(err) + b"\n\n"
