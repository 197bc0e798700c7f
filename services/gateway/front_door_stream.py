"""The front door's third shape: an answer that is bytes in pieces (``Streamed``: an image or video answer, a
stored file, an image's event stream), served by ``stream_rpc`` / ``serve_stream``.

The rest of the lifecycle (error shapes, the key check, metrics) is front_door.py's; this module is the part
only byte answers need: the response held back until the first bytes, then the body cut into messages.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.api import httpbody_pb2

from services.common.errors import MeshError
from services.gateway import auth
from services.gateway.front_door import OPENAI, ErrorShape, admitted, as_mesh_error, new_request, send_headers
from services.gateway.request_metrics import tracker

log = logging.getLogger(__name__)


# Each HttpBody carries at most this much: Envoy's transcoder writes each into the one HTTP body as it
# comes, so a large image or video never sits whole in one message.
MESSAGE_BYTES = 512 * 1024


def _pieces(data: bytes) -> list[bytes]:
    return [data[i:i + MESSAGE_BYTES] for i in range(0, len(data), MESSAGE_BYTES)] or [b""]


@dataclasses.dataclass
class Streamed:
    """A started streamed answer: what a stream's ``start`` returns once the request is parsed, checked
    and running. Nothing of ``body`` runs before the front door asks for its first piece."""

    body: AsyncGenerator[bytes, None]
    content_type: str
    model: str = ""
    # An event stream: its first bytes count as its first token, and a failure after them is the
    # ``sse_error`` event. Otherwise a failure after the first bytes can only cut the body off.
    sse: bool = False
    sse_error: Callable[[MeshError], bytes] | None = None
    # (prompt, completion, cached) tokens once the body has ended.
    tokens: Callable[[], tuple[int, int, int]] = lambda: (0, 0, 0)


StreamStart = Callable[[Any, Any, Any, str], Awaitable[Streamed]]


async def serve_stream(servicer: Any, start: StreamStart, endpoint: str, shape: ErrorShape, counted: bool,
                       request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[httpbody_pb2.HttpBody]:
    """One streamed answer from start to end; yields its HttpBody messages (the first with the content type).

    The response is held back until the answer's first bytes, so that a failure before them (routing, a
    worker that fails, an input the worker refuses, a file not found) is a real status in ``shape``. A
    client that hangs up closes the body, which closes what it reads from (a worker's call stops).
    """
    request_id = new_request(endpoint)
    door = auth.NO_KEY
    with tracker(endpoint, counted) as track:
        err: MeshError
        try:
            door = await admitted(context, endpoint, shape, metered=counted)
            answer = await start(servicer, request, context, request_id)
            door.check_model(answer.model)  # nothing of the body has run yet
            track.start(answer.model, answer.sse)
            first = await anext(answer.body, b"")
            await send_headers(context, door.headers())
        except Exception as e:  # noqa: BLE001 - a bug still gets the caller's error shape, and is logged
            err = as_mesh_error(e, endpoint, request_id)
            track.fail(err)
            door.close()
            await shape.abort(context, err, door)
        try:
            if answer.sse:
                track.first_token()
            for i, piece in enumerate(_pieces(first)):
                yield httpbody_pb2.HttpBody(content_type=answer.content_type if i == 0 else "", data=piece)
            async for data in answer.body:
                for piece in _pieces(data):
                    yield httpbody_pb2.HttpBody(data=piece)
            track.finish(*answer.tokens())
            return
        except Exception as e:  # noqa: BLE001 - reported like any other failure after the first byte
            err = as_mesh_error(e, f"{endpoint} answer", request_id)
        finally:
            await answer.body.aclose()  # cancels the worker's call if it still runs
            door.close(*answer.tokens()[:2])
        track.fail(err, mid_stream=True)
        log.warning("request %s failed after its first bytes: %s", request_id, err.message)
        if answer.sse_error is not None:
            yield httpbody_pb2.HttpBody(data=answer.sse_error(err))
            return
        await shape.abort(context, err)  # a body already begun is cut off: the client sees a broken transfer


def stream_rpc(start: StreamStart, endpoint: str, shape: ErrorShape = OPENAI, *, counted: bool = True) -> Any:
    """A servicer's streamed RPC method (in its class body) that serves the answer ``start`` begins; an
    async generator function, as ``generation_rpc``'s are."""
    return functools.partialmethod(serve_stream, start, endpoint, shape, counted)
