"""Every GrpcServer turns exceptions into statuses in one place (services/common/error_interceptor.py).

A real server on 127.0.0.1:0 serves the worker service with a servicer whose behaviour each test
scripts: a domain error must reach the caller as the same error, a bug as INTERNAL with a fixed message
that names the request id and never the exception's text, with the traceback in the service's log.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest
from meshfront.common.v1 import common_pb2
from meshfront.router.v1 import router_pb2, router_pb2_grpc
from meshfront.worker.v1 import worker_pb2, worker_pb2_grpc

from services.common.error_interceptor import request_id_metadata
from services.common.errors import InvalidRequest, Overloaded, from_rpc_error, relay
from services.common.grpc_server import GrpcServer

pytestmark = pytest.mark.service

SECRET = "password=hunter2 in /internal/path.py"


class Scripted(worker_pb2_grpc.WorkerServiceServicer, router_pb2_grpc.RouterServiceServicer):
    """Raises ``self.error`` from a unary call, a generator stream and a context.write stream."""

    error: Exception = RuntimeError(SECRET)

    async def Route(self, request, context):
        raise self.error

    async def Generate(self, request, context):  # written with context.write, as the real services do
        async def responses():
            yield worker_pb2.GenerateResponse(token_ids=[1])
            raise self.error
        await relay(responses(), context)

    async def GenerateStream(self, request_iterator, context):  # an async generator
        yield worker_pb2.GenerateStreamResponse()
        raise self.error


@pytest.fixture
async def served():
    servicer = Scripted()
    server = GrpcServer("scripted", "127.0.0.1", 0)
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(servicer, server.server)
    router_pb2_grpc.add_RouterServiceServicer_to_server(servicer, server.server)
    await server.start()
    async with grpc.aio.insecure_channel(server.address) as ch:
        yield servicer, router_pb2_grpc.RouterServiceStub(ch), worker_pb2_grpc.WorkerServiceStub(ch)
    await server.stop()


async def _fail(call) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        if hasattr(call, "__aiter__"):
            async for _ in call:
                pass
        else:
            await call
    return info.value


def _calls(router, worker, rid: str | None):
    md = request_id_metadata(rid) if rid else None
    yield router.Route(router_pb2.RouteRequest(request_id="r"), metadata=md)
    yield worker.Generate(worker_pb2.GenerateRequest(), metadata=md)

    async def one():
        yield worker_pb2.GenerateStreamRequest()
    yield worker.GenerateStream(one(), metadata=md)


async def test_a_bug_is_internal_with_the_request_id_and_no_exception_text(served, caplog):
    _, router, worker = served
    for call in _calls(router, worker, "req-42"):
        with caplog.at_level(logging.ERROR):
            err = await _fail(call)
        assert err.code() == grpc.StatusCode.INTERNAL
        assert err.details() == "internal error in the scripted (request req-42)"
        assert "hunter2" not in err.details() and "hunter2" not in str(err.trailing_metadata())
    logged = [r for r in caplog.records if "req-42" in r.getMessage()]
    assert len(logged) == 3 and all(r.exc_info and SECRET in str(r.exc_info[1]) for r in logged)


async def test_a_bug_without_a_request_id_gets_one_that_is_also_logged(served, caplog):
    _, router, _ = served
    with caplog.at_level(logging.ERROR):
        err = await _fail(router.Route(router_pb2.RouteRequest()))
    rid = err.details().removeprefix("internal error in the scripted (request ").removesuffix(")")
    assert rid.startswith("unnamed-") and any(rid in r.getMessage() for r in caplog.records)


async def test_a_domain_error_arrives_as_the_same_error(served):
    servicer, router, worker = served
    for error in (InvalidRequest("'top_k' is out of range", param="top_k", code="bad_top_k"), Overloaded("busy")):
        servicer.error = error
        for call in _calls(router, worker, "req-7"):
            err = await _fail(call)
            assert err.code() == error.grpc_code
            rebuilt = from_rpc_error(err)
            assert (type(rebuilt), rebuilt.message, rebuilt.param, rebuilt.code) == \
                (type(error), error.message, error.param, error.code)


async def test_a_method_the_servicer_does_not_implement_is_unimplemented(served):
    _, _, worker = served
    err = await _fail(worker.Embed(worker_pb2.EmbedRequest()))
    assert err.code() == grpc.StatusCode.UNIMPLEMENTED
    assert err.details() == "/meshfront.worker.v1.WorkerService/Embed is not served by the scripted"


class Flooding(worker_pb2_grpc.WorkerServiceServicer):
    """A generator servicer that sends faster than its caller reads, so it waits in grpc's send."""

    def __init__(self) -> None:
        self.closed = asyncio.Event()

    async def GenerateStream(self, request_iterator, context):
        try:
            while True:
                yield worker_pb2.GenerateStreamResponse(chunks=[worker_pb2.GenerateStreamChunk(
                    id=1, response=worker_pb2.GenerateResponse(token_ids=list(range(50_000))))])
        finally:
            self.closed.set()  # what closes the work behind a stream: a multiplexed call, a worker sequence


async def test_a_cancel_while_the_server_waits_to_send_closes_the_generator_at_once():
    servicer = Flooding()
    server = GrpcServer("flooding", "127.0.0.1", 0)
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(servicer, server.server)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(server.address) as ch:
            call = worker_pb2_grpc.WorkerServiceStub(ch).GenerateStream(iter(()))
            assert (await call.read()).chunks
            await asyncio.sleep(0.3)  # the server fills the flow-control window and waits in its send
            call.cancel()
            await asyncio.wait_for(servicer.closed.wait(), 2)  # not whenever the garbage collector runs
    finally:
        await server.stop()



def _string_not_utf8(message, field: str) -> bytes:
    """The wire bytes of ``message`` with ``field`` (a string) set to b"\\xff", which no proto library writes."""
    f = message.DESCRIPTOR.fields_by_name[field]
    assert f.type == f.TYPE_STRING
    return bytes([f.number << 3 | 2, 1, 0xFF])


async def test_a_request_that_does_not_parse_is_invalid_argument_without_a_traceback(caplog):
    """grpc's own answer named DecodeError and the proto type, with a traceback in the log (a KServe
    ModelInferRequest with such a model_name, sent through Envoy, did the same)."""
    server = GrpcServer("scripted", "127.0.0.1", 0)
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(Scripted(), server.server)
    router_pb2_grpc.add_RouterServiceServicer_to_server(Scripted(), server.server)
    await server.start()
    caplog.set_level(logging.ERROR)
    route_request = _string_not_utf8(router_pb2.RouteRequest, "request_id")
    # GenerateRequest.request (field 1) holds a PreprocessedRequest whose request_id (field 1) is not UTF-8.
    inner = _string_not_utf8(common_pb2.PreprocessedRequest, "request_id")
    generate_request = bytes([1 << 3 | 2, len(inner)]) + inner
    try:
        async with grpc.aio.insecure_channel(server.address) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as unary:
                await ch.unary_unary("/meshfront.router.v1.RouterService/Route")(route_request, timeout=10)
            with pytest.raises(grpc.aio.AioRpcError) as streamed:
                async for _ in ch.unary_stream("/meshfront.worker.v1.WorkerService/Generate")(generate_request,
                                                                                             timeout=10):
                    pass
    finally:
        await server.stop()
    for e in (unary.value, streamed.value):
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
        assert "DecodeError" not in e.details() and "Request" not in e.details(), e.details()
    assert "Traceback" not in caplog.text and "DecodeError" not in caplog.text
