"""gRPC glue for ``inference.GRPCInferenceService`` (KServe v2 / Triton) on the gateway's server.

Requests go through the same Pipeline as the OpenAI API (preprocess, route,
generate, release), so cancellation, routing and errors behave the same.
Unary calls fail with a gRPC status carrying ErrorInfo; on ModelStreamInfer a
failing request gets ``error_message`` (Triton's way: tritonclient hands it to
the callback) and the stream goes on serving the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable

import grpc

from services.common.discovery import WorkerCard
from services.common.errors import InvalidRequest, MeshError, ModelNotFound, NotFound
from services.gateway.kserve import metadata, protocol
from services.gateway.kserve.requests import KServeRequest, parse_request
from services.gateway.kserve.responses import ResponseBuilder
from services.gateway.openai.requests import ChatRequest
from services.gateway.openai.to_proto import chat_to_preprocess, completion_to_preprocess, postprocess_options
from services.gateway.pipeline import Pipeline

log = logging.getLogger(__name__)
# Responses waiting for a slow stream reader before the generating requests pause (backpressure).
STREAM_QUEUE = 64
# Requests one ModelStreamInfer call may have in flight; the reader waits beyond it.
MAX_IN_FLIGHT_PER_STREAM = 256
_END = object()


def _headers(context: grpc.aio.ServicerContext) -> dict[str, str]:
    return {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}


class KServeServicer:
    def __init__(self, pipeline: Pipeline, models: Callable[[], dict[str, list[WorkerCard]]],
                 draining: Callable[[], bool] = lambda: False):
        self._pipeline = pipeline
        self._models = models
        self._draining = draining

    def _check_model(self, name: str, version: str) -> None:
        if name not in self._models():
            raise ModelNotFound(f"The model `{name}` does not exist or has no live worker.", param="model_name",
                                code="model_not_found")
        if not metadata.version_known(version):
            raise NotFound(f"The model `{name}` has no version {version!r}; it serves version "
                           f"{metadata.MODEL_VERSION!r}", param="model_version")

    async def ServerLive(self, request, context):
        return protocol.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return protocol.ServerReadyResponse(ready=bool(self._models()) and not self._draining())

    async def ModelReady(self, request, context):
        ready = request.name in self._models() and metadata.version_known(request.version)
        return protocol.ModelReadyResponse(ready=ready)

    async def ServerMetadata(self, request, context):
        return metadata.server_metadata()

    async def ModelMetadata(self, request, context):
        self._check_model(request.name, request.version)
        return metadata.model_metadata(request.name)

    async def ModelConfig(self, request, context):
        self._check_model(request.name, request.version)
        return metadata.model_config(request.name)

    def _start(self, request, context) -> tuple[KServeRequest, AsyncIterator]:
        """Parses, checks the model and starts the pipeline (lazily: nothing runs before iteration)."""
        parsed = parse_request(request, _headers(context))
        self._check_model(request.model_name, request.model_version)
        rid = uuid.uuid4().hex
        req = parsed.parsed
        prep = [chat_to_preprocess(req, rid) if isinstance(req, ChatRequest)
                else completion_to_preprocess(req, req.prompts[0], rid)]
        log.debug("kserve request %r runs as %s", request.id, rid)
        return parsed, self._pipeline.run(prep, req.n, req.worker_id, options=postprocess_options(req, prep[0]))

    async def ModelInfer(self, request, context):
        parsed, stream = self._start(request, context)
        if parsed.stream:
            raise InvalidRequest("ModelInfer returns one response; use ModelStreamInfer to stream", param="stream")
        builder = ResponseBuilder(request.model_name, request.id, parsed.outputs, decoupled=False)
        deltas = [d async for batch in stream for d in batch]
        return builder.data(deltas)

    async def _serve_one(self, request, context, put: Callable) -> None:
        """Answers one request of a ModelStreamInfer call; errors become its error_message."""
        try:
            parsed, stream = self._start(request, context)
            builder = ResponseBuilder(request.model_name, request.id, parsed.outputs, decoupled=True,
                                      empty_final=parsed.empty_final)
            if parsed.stream is False:
                await put(builder.data([d async for batch in stream for d in batch]))
            else:
                async for batch in stream:
                    await put(builder.data(batch))
            closing = builder.closing()
            if closing is not None:
                await put(closing)
        except MeshError as e:
            log.info("kserve stream request %r failed: %s", request.id, e.message)
            await put(protocol.ModelStreamInferResponse(error_message=f"{e.grpc_code.name}: {e.message}"))
        except Exception:  # noqa: BLE001 - one request's bug must not end the other requests' stream
            log.exception("kserve stream request %r failed", request.id)
            await put(protocol.ModelStreamInferResponse(error_message="INTERNAL: the request failed"))

    async def ModelStreamInfer(self, request_iterator, context):
        out: asyncio.Queue = asyncio.Queue(STREAM_QUEUE)
        tasks: set[asyncio.Task] = set()
        slots = asyncio.Semaphore(MAX_IN_FLIGHT_PER_STREAM)

        async def put(item) -> None:
            if not isinstance(item, protocol.ModelStreamInferResponse):
                item = protocol.ModelStreamInferResponse(infer_response=item)
            await out.put(item)

        async def serve(request) -> None:
            try:
                await self._serve_one(request, context, put)
            finally:
                slots.release()

        async def read() -> None:
            try:
                async for request in request_iterator:
                    await slots.acquire()
                    task = asyncio.create_task(serve(request))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                while tasks:
                    await asyncio.wait(set(tasks))
                await out.put(_END)
            except Exception as e:  # noqa: BLE001 - handed to the handler, which ends the call with it
                await out.put(e)

        reader = asyncio.create_task(read())
        try:
            while (item := await out.get()) is not _END:
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            reader.cancel()
            for task in (reader, *tasks):
                task.cancel()
            for task in (reader, *tasks):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task


def add_to_server(servicer: KServeServicer, server: grpc.aio.Server) -> None:
    """Registers the servicer for every RPC in protos/inference (others answer UNIMPLEMENTED)."""
    handlers = {}
    for name, (req_cls, resp_cls, client_streaming, server_streaming) in protocol.METHODS.items():
        kind = {(False, False): grpc.unary_unary_rpc_method_handler,
                (True, True): grpc.stream_stream_rpc_method_handler}[(client_streaming, server_streaming)]
        handlers[name] = kind(getattr(servicer, name), request_deserializer=req_cls.FromString,
                              response_serializer=resp_cls.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(protocol.SERVICE, handlers),))
    if hasattr(server, "add_registered_method_handlers"):
        server.add_registered_method_handlers(protocol.SERVICE, handlers)
