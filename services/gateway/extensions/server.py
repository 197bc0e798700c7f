"""gRPC glue of ``ExtensionRoutesService``: each extension route's call, through the front door.

Envoy reaches ``Get`` and ``Post`` only on the paths the launcher rendered (services/launcher/envoy_config.py
``extension_route``) and names the path in ``x-meshfront-route``. Each call is one ``serve_unary`` request, as
the gateway's own unary routes are: its metrics under the endpoint label of its path (model ""), its trace
span, a handler's ``ExtensionError`` or error ``Response`` as the HTTP status and body, and any other exception
a logged 500 in OpenAI's shape.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Sequence

import grpc
import orjson
from google.api import httpbody_pb2
from meshfront.gateway.v1 import extensions_pb2, extensions_pb2_grpc

from services.common.errors import Internal, InvalidRequest, MeshError, NotFound
from services.gateway.core.errors import error_body
from services.gateway.core.extension_hooks import ExtensionError
from services.gateway.extensions.routes import Response, Route, RouteRequest
from services.gateway.front_door import OPENAI, ErrorShape, Models, Reply, Started, headers, serve_unary

log = logging.getLogger(__name__)
ROUTE_HEADER = "x-meshfront-route"  # set by Envoy's Lua filter from the route's path
REQUEST_ID_HEADER = "x-request-id"
# An error body travels in a trailer (Envoy's Lua filter lifts it): well under gRPC's and Envoy's limits.
MAX_ERROR_BODY = 8192
# The metrics label of a call whose path this gateway does not serve (its extensions differ from Envoy's).
UNKNOWN_ENDPOINT = "extension"


def _error_body(err: MeshError) -> bytes:
    return err.body if isinstance(err, ExtensionError) and err.body is not None else error_body(err)


SHAPE = ErrorShape(body=_error_body, retry_after=OPENAI.retry_after)


class GatewayState:
    """``FrontendState`` over the gateway's registry, warm-up and drain."""

    def __init__(self, models: Models, ready: Callable[[], bool], draining: Callable[[], bool]):
        self._models, self._ready, self._draining = models, ready, draining

    def is_ready(self) -> bool:
        return self._ready() and not self._draining()

    def is_draining(self) -> bool:
        return self._draining()

    def model_names(self) -> list[str]:
        return sorted(self._models())

    def is_model_ready(self, name: str) -> bool:
        return bool(self._models().get(name))


class ExtensionRoutesServicer(extensions_pb2_grpc.ExtensionRoutesServiceServicer):
    def __init__(self, routes: Sequence[Route], state: GatewayState):
        self._routes = {(r.method, r.path): r for r in routes}
        self._state = state

    async def Get(self, request: extensions_pb2.ExtensionGetRequest, context: grpc.aio.ServicerContext):
        return await self._serve("GET", b"", context)

    async def Post(self, request: httpbody_pb2.HttpBody, context: grpc.aio.ServicerContext):
        return await self._serve("POST", request.data, context)

    async def _serve(self, method: str, data: bytes, context: grpc.aio.ServicerContext) -> httpbody_pb2.HttpBody:
        path = headers(context).get(ROUTE_HEADER, "")
        route = self._routes.get((method, path))
        endpoint = path if route is not None else UNKNOWN_ENDPOINT  # labels stay the routes declared

        async def answer(servicer: object, request: object, ctx: object, rid: str, started: Started) -> Reply:
            if route is None:
                raise NotFound(f"No extension route {method} {path or '(none named)'} on this gateway")
            started("")
            call = RouteRequest(method, path, headers(context).get(REQUEST_ID_HEADER, rid), headers(context),
                                _json(data), self._state)
            return Reply(_message(route, await _call(route, call)))
        # Counted in /metrics but spends no quota (``metered``): a route reads the gateway's state, generating nothing.
        return await serve_unary(self, answer, endpoint, SHAPE, True, None, context, metered=False)


def _json(data: bytes) -> object:
    if not data:
        return None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise InvalidRequest(f"The request body is not valid JSON: {e}") from None


async def _call(route: Route, request: RouteRequest) -> object:
    """The handler's answer: awaited on the loop when it is a coroutine function, else run in a thread."""
    if inspect.iscoroutinefunction(route.handler):
        return await route.handler(request)
    result = await asyncio.to_thread(route.handler, request)
    return await result if inspect.isawaitable(result) else result


def _message(route: Route, result: object) -> httpbody_pb2.HttpBody:
    response = result if isinstance(result, Response) else Response(200, result)
    data = response.encoded()
    if response.status_code == 200:
        return httpbody_pb2.HttpBody(content_type=response.content_type, data=data)
    if len(data) > MAX_ERROR_BODY:
        log.error("%s %s answered %d with a %d-byte body; an error body is at most %d bytes", route.method,
                  route.path, response.status_code, len(data), MAX_ERROR_BODY)
        raise Internal("the extension route's error body is too large")
    err = ExtensionError(response.status_code, f"{route.method} {route.path} answered {response.status_code}")
    err.body = data
    raise err
