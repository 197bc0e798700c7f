"""The one function that renders a domain error as an OpenAI error body."""

from __future__ import annotations

import json

from services.common.errors import MeshError


def error_body(err: MeshError) -> bytes:
    # ASCII-only: the same bytes travel in a gRPC trailer (Envoy's Lua filter lifts it into the HTTP body).
    return json.dumps({"error": {"message": err.message, "type": err.openai_type, "param": err.param,
                                 "code": err.code or err.http_status}}, ensure_ascii=True).encode()


def sse_error_frame(err: MeshError) -> bytes:
    """A mid-stream error: the HTTP status is already 200, so it travels in-band."""
    return b"data: " + error_body(err) + b"\n\n"
