"""Domain errors and the one table that maps them to gRPC statuses and HTTP codes.

Cores raise these; server glue turns them into a gRPC status carrying a
``google.rpc.ErrorInfo`` (reason, domain, param), and clients of a service
turn such a status back into the same exception, so an error keeps its
meaning across hops. The gateway renders them as OpenAI error bodies.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from services.common.write_rounds import write_in_round

DOMAIN = "meshfront"

log = logging.getLogger(__name__)
# Messages echo client values (ids, model names, parameter names) and travel in gRPC trailers three times
# over (grpc-message percent-encoded, the status details, the HTTP body the gateway hands Envoy), where
# gRPC clients refuse more than 8-16 KiB and Envoy more than 60 KiB: a 100 KB id once turned a 404 into a
# 502 "protocol error". Every message and param is bounded here, whatever raised it.
MAX_MESSAGE_BYTES = 1024
MAX_PARAM_BYTES = 256


def bounded(text: str, limit: int) -> str:
    """``text`` within ``limit`` UTF-8 bytes, cut in the middle: a message's start says what was wrong
    and its end often the verdict ("... not found"), while the echoed value sits between them."""
    raw = text.encode()
    if len(raw) <= limit:
        return text
    marker = f" [{len(raw) - limit} bytes cut] "
    keep = max(limit - len(marker), 0)
    # errors="ignore" drops a character split by the cut, so the result stays within the limit
    head = raw[:keep - keep // 3].decode(errors="ignore")
    tail = raw[len(raw) - keep // 3:].decode(errors="ignore") if keep // 3 else ""
    return head + marker + tail


class MeshError(Exception):
    """Base class: a message for the client, a machine-readable reason, an optional param.

    Both are bounded (``bounded``): raisers may echo what the client sent without measuring it."""

    grpc_code = grpc.StatusCode.INTERNAL
    http_status = 500
    openai_type = "internal_server_error"
    reason = "INTERNAL"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        message = bounded(message, MAX_MESSAGE_BYTES)
        super().__init__(message)
        self.message = message
        self.param = None if param is None else bounded(param, MAX_PARAM_BYTES)
        self.code = code


class InvalidRequest(MeshError):
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT
    http_status = 400
    openai_type = "invalid_request_error"
    reason = "INVALID_REQUEST"


class ModelNotFound(MeshError):
    grpc_code = grpc.StatusCode.NOT_FOUND
    http_status = 404
    openai_type = "not_found_error"
    reason = "MODEL_NOT_FOUND"


class NotFound(MeshError):
    grpc_code = grpc.StatusCode.NOT_FOUND
    http_status = 404
    openai_type = "not_found_error"
    reason = "NOT_FOUND"


class NoWorkers(MeshError):
    grpc_code = grpc.StatusCode.UNAVAILABLE
    http_status = 503
    openai_type = "service_unavailable"
    reason = "NO_WORKERS"


class Overloaded(MeshError):
    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    http_status = 503
    openai_type = "service_unavailable"
    reason = "OVERLOADED"


class WorkerFailed(MeshError):
    grpc_code = grpc.StatusCode.UNAVAILABLE
    http_status = 503
    openai_type = "service_unavailable"
    reason = "WORKER_FAILED"


class Draining(MeshError):
    """A replica that is shutting down refused a new sequence on a multiplexed stream: start it on another."""

    grpc_code = grpc.StatusCode.UNAVAILABLE
    http_status = 503
    openai_type = "service_unavailable"
    reason = "DRAINING"


class StageUnavailable(MeshError):
    """A stage of the mesh (preprocessor, router, postprocessor) stayed unreachable past the wait for it."""

    grpc_code = grpc.StatusCode.UNAVAILABLE
    http_status = 503
    openai_type = "service_unavailable"
    reason = "STAGE_UNAVAILABLE"

    @classmethod
    def of(cls, stage: str) -> StageUnavailable:
        """The fixed text the client gets; what gRPC said about the stage goes to the log."""
        return cls(f"the {stage} is unavailable")


class Cancelled(MeshError):
    grpc_code = grpc.StatusCode.CANCELLED
    http_status = 499
    openai_type = "client_closed_request"
    reason = "CANCELLED"


class Internal(MeshError):
    pass


_BY_REASON: dict[str, type[MeshError]] = {
    cls.reason: cls
    for cls in (InvalidRequest, ModelNotFound, NotFound, NoWorkers, Overloaded, WorkerFailed, Draining,
                StageUnavailable, Cancelled, Internal)
}

# Statuses that arrive without our ErrorInfo (a peer that died, a deadline, a transport error), and the
# fixed text the client gets for each: gRPC's own details name addresses, sockets and channel internals
# ("connections to all backends failing; last error: UNAVAILABLE: ipv4:127.0.0.1:9300"), so they go to
# the log only.
_TRANSPORT_TEXT: dict[grpc.StatusCode, str] = {
    grpc.StatusCode.UNAVAILABLE: "a service this request needs is unavailable",
    grpc.StatusCode.DEADLINE_EXCEEDED: "a service this request needs did not answer in time",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "the server is overloaded",
    grpc.StatusCode.CANCELLED: "the request was cancelled",
}
_BY_CODE: dict[grpc.StatusCode, type[MeshError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidRequest,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.UNAVAILABLE: WorkerFailed,
    grpc.StatusCode.RESOURCE_EXHAUSTED: Overloaded,
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.DEADLINE_EXCEEDED: WorkerFailed,
}


def status_proto(err: MeshError) -> status_pb2.Status:
    """``err`` as a ``google.rpc.Status`` carrying our ErrorInfo (what a gRPC abort sends as details)."""
    info = error_details_pb2.ErrorInfo(reason=err.reason, domain=DOMAIN)
    if err.param:
        info.metadata["param"] = err.param
    if err.code:
        info.metadata["code"] = err.code
    detail = any_pb2.Any()
    detail.Pack(info)
    return status_pb2.Status(code=err.grpc_code.value[0], message=err.message, details=[detail])


def to_status(err: MeshError) -> tuple[grpc.StatusCode, str, tuple[tuple[str, bytes], ...]]:
    """(code, message, trailing metadata with grpc-status-details-bin) for ``context.abort``."""
    status = status_proto(err)
    return err.grpc_code, err.message, (("grpc-status-details-bin", status.SerializeToString()),)


def _ours(status: status_pb2.Status) -> MeshError | None:
    """The domain error ``status_proto`` encoded in ``status``, if it carries our ErrorInfo."""
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info) and info.domain == DOMAIN and info.reason in _BY_REASON:
            return _BY_REASON[info.reason](status.message, param=info.metadata.get("param") or None,
                                           code=info.metadata.get("code") or None)
    return None


def from_status_proto(status: status_pb2.Status) -> MeshError:
    """Rebuilds the domain error ``status_proto`` encoded (Internal when it carries none of ours)."""
    return _ours(status) or Internal(status.message or "internal error")


def ours_in(e: grpc.aio.AioRpcError) -> MeshError | None:
    """The domain error a peer raised, when the status carries our ErrorInfo (None: gRPC's own failure)."""
    for key, value in e.trailing_metadata() or ():
        if key == "grpc-status-details-bin" and (ours := _ours(status_pb2.Status.FromString(value))):
            return ours
    return None


def from_rpc_error(e: grpc.aio.AioRpcError) -> MeshError:
    """Rebuilds the domain error a peer raised (or the closest one for transport failures).

    A status without our ErrorInfo comes from gRPC itself (or a peer that is not ours): the client gets
    a fixed text for its code, and gRPC's details (addresses, sockets) go to the log.
    """
    ours = ours_in(e)
    if ours is not None:
        return ours
    code = e.code()
    log.warning("call failed: %s %s", code.name, e.details())
    return _BY_CODE.get(code, Internal)(_TRANSPORT_TEXT.get(code, "internal error"))


async def relay(responses: AsyncGenerator, context: grpc.aio.ServicerContext) -> None:
    """Writes a service's response stream to a gRPC server stream.

    Failures propagate to the server's ErrorInterceptor (services/common/error_interceptor.py), which
    turns them into the call's status. It writes with ``context.write`` rather than being a generator
    itself so that the handler task owns the stream: a caller's cancel lands here, and the ``finally``
    closes ``responses`` (aborting the work below) at once, not whenever an abandoned generator is
    collected. Each write goes out with the loop turn's other writes (services/common/write_rounds.py).
    """
    try:
        async for response in responses:
            await write_in_round(context, response)
    finally:
        await responses.aclose()
