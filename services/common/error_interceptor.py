"""The one place where a service's exceptions become gRPC statuses.

Every ``GrpcServer`` installs :class:`ErrorInterceptor`. A :class:`MeshError` leaves as its status with
``google.rpc.ErrorInfo`` details (services/common/errors.py), so the caller rebuilds the same error. Any
other exception is a bug: it is logged with its traceback and the request id, and the caller gets
INTERNAL with a fixed message naming the service and the request id, never the exception's text.

Servicers therefore raise and never catch to abort. What stays in servicers is in-band error handling
that is not a call's status: one request's failure inside a multiplexed stream, or the gateway's HTTP
error trailers for Envoy (services/gateway/front_door.py).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from services.common import tracing
from services.common.errors import Internal, InvalidRequest, MeshError, to_status
from services.common.write_rounds import write_in_round

# Callers that know the request id send it, so that a log line and a client's error meet.
REQUEST_ID_KEY = "x-request-id"

Behavior = Callable[[Any, grpc.aio.ServicerContext], Any]
_UNTRACED = contextlib.nullcontext()


def request_id_metadata(request_id: str) -> tuple[tuple[str, str]]:
    """Call metadata that names the request in the callee's error logs."""
    return ((REQUEST_ID_KEY, request_id),)


class _Undecodable:
    """A request message grpc could not parse (a proto3 string that is not UTF-8, truncated bytes).

    grpc answers a deserializer's exception itself: a traceback in the log and a status that names the
    exception's class and the proto type. The call's wrapper turns this into INVALID_ARGUMENT instead.
    """

    @staticmethod
    def error() -> InvalidRequest:
        return InvalidRequest("The request message could not be parsed: malformed bytes, or a string field "
                              "that is not UTF-8")


def _tolerant(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserialize is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except DecodeError:
            return _Undecodable()
    return parse


async def _checked(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """A request stream whose undecodable message raises InvalidRequest in the servicer's read loop (the
    servicers end the call with it). One step per request message, none per response."""
    async for request in requests:
        if isinstance(request, _Undecodable):
            raise request.error()
        yield request


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, service: str):
        self.service = service
        # The gateway's calls come from Envoy: their x-request-id is the client's, the key to the trace.
        self._edge = service == "gateway"
        self._log = logging.getLogger(f"services.{service}")

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method
        sent = dict(details.invocation_metadata or ()).get(REQUEST_ID_KEY)
        rid = sent if isinstance(sent, str) else ""  # only keys ending in -bin carry bytes
        scope = self._server_span(handler, method, details.invocation_metadata, rid)
        # Request messages are parsed tolerantly and refused as the caller's mistake (``_Undecodable``).
        io = {"request_deserializer": _tolerant(handler.request_deserializer),
              "response_serializer": handler.response_serializer}
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(self._unary(handler.unary_unary, method, rid, scope=scope),
                                                       **io)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(self._stream(handler.unary_stream, method, rid, scope=scope),
                                                        **io)
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(
                self._unary(handler.stream_unary, method, rid, streamed=True), **io)
        return grpc.stream_stream_rpc_method_handler(
            self._stream(handler.stream_stream, method, rid, streamed=True), **io)

    def _server_span(self, handler: Any, method: str, metadata: Any, rid: str) -> Any:
        """A span for one call of a traced request (one that names a trace or a request id), made current
        for the call: the stages' own spans nest under it. Never for a multiplexed stream (it carries many
        requests, each with its own ``traceparent``) nor for health checks; a no-op when tracing is off."""
        if not tracing.ENABLED or handler.stream_stream or method.startswith("/grpc.health"):
            return _UNTRACED
        parent = tracing.from_metadata(metadata)
        if not parent and not rid:
            return _UNTRACED
        return tracing.server_span(f"{self.service} {method.rsplit('/', 1)[-1]}", parent, rid, edge=self._edge)

    async def _fail(self, context: grpc.aio.ServicerContext, err: Exception, method: str, rid: str) -> None:
        if isinstance(err, MeshError):
            code, message, trailers = to_status(err)
            await context.abort(code, message, trailing_metadata=trailers)
        if isinstance(err, NotImplementedError):  # a generated servicer base's method: not served here
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method} is not served by the {self.service}")
        # No request id from the caller: a fresh one still ties the client's message to this log line.
        rid = rid or f"unnamed-{uuid.uuid4().hex[:12]}"
        self._log.error("%s failed on request %s", method, rid, exc_info=err)
        code, message, trailers = to_status(Internal(f"internal error in the {self.service} (request {rid})"))
        await context.abort(code, message, trailing_metadata=trailers)

    def _peer_gone(self, err: grpc.aio.InternalError, method: str, rid: str) -> None:
        # grpc's own write failed: the caller cancelled or went away between our check and the send.
        # Nobody is left to answer, and it is not a bug of ours.
        self._log.info("%s for request %s ended by the transport: %s", method, rid or "(unnamed)", err)

    def _unary(self, behavior: Behavior, method: str, rid: str, streamed: bool = False,
               scope: Any = _UNTRACED) -> Behavior:
        async def answer(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                if streamed:
                    request = _checked(request)
                elif isinstance(request, _Undecodable):
                    raise request.error()
                return await behavior(request, context)
            except grpc.aio.AbortError:
                raise  # the servicer set the status itself
            except grpc.aio.InternalError as e:
                self._peer_gone(e, method, rid)
                return None
            except Exception as e:  # noqa: BLE001 - every failure becomes a status here, and only here
                await self._fail(context, e, method, rid)
        return answer if scope is _UNTRACED else _within(scope, answer)

    def _stream(self, behavior: Behavior, method: str, rid: str, streamed: bool = False,
                scope: Any = _UNTRACED) -> Behavior:
        if not inspect.isasyncgenfunction(behavior):  # writes with context.write (errors.relay)
            return self._unary(behavior, method, rid, streamed, scope)

        async def drive(request: Any, context: grpc.aio.ServicerContext) -> None:
            # A generator servicer is driven from here with context.write, not handed to grpc to iterate:
            # a caller's cancel must land in this task's own await, so that the ``finally`` closes the
            # servicer's generators (and what they hold open upstream: a multiplexed call, a worker
            # sequence) at once. Iterated by grpc, a cancel during its send left them suspended until
            # the garbage collector found them, and the worker generated on for nobody. Each write goes
            # out with the loop turn's other writes (services/common/write_rounds.py).
            if streamed:
                request = _checked(request)
            elif isinstance(request, _Undecodable):
                await self._fail(context, request.error(), method, rid)
            responses = behavior(request, context)
            try:
                async for response in responses:
                    await write_in_round(context, response)
            except grpc.aio.AbortError:
                raise
            except grpc.aio.InternalError as e:
                self._peer_gone(e, method, rid)
            except Exception as e:  # noqa: BLE001 - every failure becomes a status here, and only here
                await self._fail(context, e, method, rid)
            finally:
                await responses.aclose()
        return drive if scope is _UNTRACED else _within(scope, drive)


def _within(scope: Any, behavior: Behavior) -> Behavior:
    """``behavior`` with ``scope`` (the call's span, current) around it: only for traced calls, so an untraced
    call runs exactly as it did without tracing."""
    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        with scope:
            return await behavior(request, context)
    return call
