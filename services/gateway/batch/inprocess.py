"""A batch line run through the gateway's own servicers, in its process: no HTTP to itself, no Envoy.

The servicer's RPC method runs with ``LineCall`` as its gRPC context. The front door aborts a failing call
with the HTTP status and body Envoy would have made of it (the ``x-meshfront-status`` / ``x-meshfront-body``
trailers, services/gateway/front_door.py ``http_trailers``): ``LineCall.abort`` raises them as ``LineFailed``,
so a line's error in the error file is byte for byte the error the same request gets over HTTP.

With ``--auth`` (services/gateway/auth/), the batch's key (the one that created it; its id is in the batch's
record, never its secret) is checked again before each line (``batch_line``: a key revoked since, a model
outside its list) and charged each line's tokens after it (``batch_usage``).
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, NoReturn

import grpc
import orjson
from google.api import httpbody_pb2

from services.common.errors import MeshError
from services.gateway import auth, scheduling
from services.gateway.batch.lines import Outcome
from services.gateway.core.errors import error_body

# A servicer's RPC method: (HttpBody, context) -> HttpBody (unary) or an async iterator of them (a generation).
Rpc = Callable[[httpbody_pb2.HttpBody, Any], Any]
# (endpoint, request body, tenant, key id) -> how the line ended.
Execute = Callable[[str, bytes, str, str], Awaitable[Outcome]]
# Statuses a line waits out and tries again (the mesh busy or restarting, a quota): never a line's failure.
RETRY_STATUSES = (429, 502, 503, 504)
# The gRPC code of an abort that carried no HTTP status (never from an HTTP front end; kept total).
_HTTP_OF = {grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.NOT_FOUND: 404,
            grpc.StatusCode.RESOURCE_EXHAUSTED: 429, grpc.StatusCode.UNAVAILABLE: 503}


class LineFailed(Exception):
    """The call ended with an error: its HTTP status and OpenAI error body."""

    def __init__(self, status: int, body: dict[str, Any]):
        super().__init__(f"{status}: {body}")
        self.status = status
        self.body = body


class LineCall:
    """The gRPC context a batch line's call runs with: the headers it carries, and abort as an exception."""

    def __init__(self, metadata: Mapping[str, str]):
        self._metadata = tuple(metadata.items())

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    async def send_initial_metadata(self, metadata: Any) -> None:
        """Response headers (nvext timing, ...) have no place in an output line."""

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> NoReturn:
        trailers = {k: v for k, v in trailing_metadata or () if isinstance(v, str)}
        if "x-meshfront-status" in trailers:
            raise LineFailed(int(trailers["x-meshfront-status"]), orjson.loads(trailers["x-meshfront-body"]))
        status = _HTTP_OF.get(code, 500)
        raise LineFailed(status, {"error": {"message": details, "type": "api_error", "param": None,
                                            "code": status}})


async def _call(rpc: Rpc, body: bytes, call: LineCall) -> bytes:
    result: Any = rpc(httpbody_pb2.HttpBody(content_type="application/json", data=body), call)
    if inspect.isasyncgen(result):  # a generation: a non-streamed one is one message
        messages: AsyncIterator[httpbody_pb2.HttpBody] = result
        return b"".join([m.data async for m in messages])
    reply: httpbody_pb2.HttpBody = await result
    return reply.data


class InProcess:
    """Runs batch lines on the servicers ``rpcs`` maps each endpoint to (assembly.py builds the map)."""

    def __init__(self, rpcs: Mapping[str, Rpc]):
        self._rpcs = dict(rpcs)

    @property
    def endpoints(self) -> tuple[str, ...]:
        return tuple(self._rpcs)

    async def __call__(self, endpoint: str, body: bytes, tenant: str, key_id: str) -> Outcome:
        """Runs one line; a 4xx or 500 is its outcome, a status in ``RETRY_STATUSES`` raises ``LineFailed``."""
        request_id = uuid.uuid4().hex
        if key_id:
            model = orjson.loads(body).get("model")
            try:
                auth.batch_line(key_id, model if isinstance(model, str) else "")
            except MeshError as e:
                return Outcome(e.http_status, orjson.loads(error_body(e)), request_id)
        call = LineCall({"x-request-id": request_id})
        auth.BATCH_LINE.set(True)  # this line's task only (each line runs in a task of its own: runner.py)
        scheduling.batch_line(tenant)  # the router's lowest class, a flow of the tenant's own (scheduling.py)
        try:
            data = await _call(self._rpcs[endpoint], body, call)
        except LineFailed as e:
            if e.status in RETRY_STATUSES:
                raise
            return Outcome(e.status, e.body, request_id)
        answer = orjson.loads(data)
        if key_id:
            auth.batch_usage(tenant, *tokens(answer))
        return Outcome(200, answer, request_id)


def tokens(answer: Any) -> tuple[int, int]:
    """(prompt, completion) tokens of an answer's ``usage``: chat, completions and embeddings name them so,
    the Responses API ``input_tokens`` / ``output_tokens``."""
    usage = answer.get("usage") if isinstance(answer, dict) else None
    if not isinstance(usage, dict):
        return 0, 0
    prompt = usage.get("prompt_tokens", usage.get("input_tokens", 0))
    completion = usage.get("completion_tokens", usage.get("output_tokens", 0))
    return (prompt if isinstance(prompt, int) else 0), (completion if isinstance(completion, int) else 0)
