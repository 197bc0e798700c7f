"""gRPC glue for ``inference.GRPCInferenceService`` (KServe v2 / Triton) on the gateway's server.

Requests go through the same front door (services/gateway/front_door.py) and Pipeline as the
OpenAI API (preprocess, route, generate, release), so cancellation, routing, errors and metrics
(endpoint ``kserve``) behave the same. Unary calls fail with a gRPC status carrying ErrorInfo; on
ModelStreamInfer a failing request gets ``error_message`` (Triton's way: tritonclient hands it to
the callback) and the stream goes on serving the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable

import grpc

from services.common.discovery import IMAGES, VIDEOS, ModelCard
from services.common.errors import InvalidRequest, MeshError, NotFound
from services.gateway.core.pipeline import Pipeline
from services.gateway.core.request import ChatRequest
from services.gateway.core.to_proto import chat_to_preprocess, completion_to_preprocess, postprocess_options
from services.gateway.front_door import (
    AS_IS,
    GRPC,
    Generation,
    Models,
    check_model,
    headers,
    key_checked,
    serve_generation,
)
from services.gateway.kserve import metadata, protocol
from services.gateway.kserve.media_infer import MediaInfer
from services.gateway.kserve.render import InferResponseBuilder, error_response
from services.gateway.kserve.request import parse_request
from services.gateway.media.runner import MediaRunner

log = logging.getLogger(__name__)
# Responses waiting for a slow stream reader before the generating requests pause (backpressure).
STREAM_QUEUE = 64
# Requests one ModelStreamInfer call may have in flight; the reader waits beyond it.
MAX_IN_FLIGHT_PER_STREAM = 256
_END = object()
ENDPOINT = "kserve"  # the requests' ``endpoint`` label in /metrics
METADATA = "kserve metadata"  # the metadata calls' name in the logs (they are not counted)


def _serve(servicer: KServeServicer, request, context: grpc.aio.ServicerContext, *, unary: bool):
    """The front door over one request: ModelInfer's (unary: an error is the call's status) or one of a
    ModelStreamInfer call (an early error is raised to ``_serve_one``, a later one is its ``error_message``)."""
    start = functools.partial(KServeServicer._start_generation, unary=unary, call_headers=headers(context))
    return serve_generation(servicer, start, ENDPOINT, GRPC, request, context if unary else None, AS_IS,
                            call_headers=headers(context))  # a stream's requests present the stream's key


class KServeServicer:
    def __init__(self, pipeline: Pipeline, models: Models, draining: Callable[[], bool] = lambda: False,
                 media: MediaRunner | None = None):
        self._pipeline = pipeline
        self._models = models
        self._draining = draining
        self._media = None if media is None else MediaInfer(media, self._check_model)

    def _media_card(self, name: str) -> ModelCard | None:
        """The card of a media model served as a tensor model (kserve/media.py); None for a text model."""
        cards = self._models().get(name)
        if self._media is None or not cards or not cards[0].model.is_media:
            return None
        return cards[0].model

    def _check_model(self, name: str, version: str) -> None:
        """A text model, or (with the media spine) an image or video model served as a tensor model."""
        card = self._media_card(name)
        media = next(kind for kind in (IMAGES, VIDEOS) if card.serves(kind)) if card is not None else None
        check_model(self._models(), name, media=media, param="model_name")
        if not metadata.version_known(version):
            raise NotFound(f"The model `{name}` has no version {version!r}; it serves version "
                           f"{metadata.MODEL_VERSION!r}", param="model_version")

    # ServerLive and ServerReady need no key (--auth): they are the health probes (a load balancer's, Triton's
    # clients' is_server_live) and say nothing of what is served. Every other call presents the key.
    async def ServerLive(self, request, context):
        return protocol.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return protocol.ServerReadyResponse(ready=bool(self._models()) and not self._draining())

    async def ModelReady(self, request, context):
        door = await key_checked(context, METADATA, GRPC)
        ready = request.name in door.visible(self._models()) and metadata.version_known(request.version)
        return protocol.ModelReadyResponse(ready=ready)

    async def ServerMetadata(self, request, context):
        await key_checked(context, METADATA, GRPC)
        return metadata.server_metadata()

    async def _described(self, request, context) -> bool:
        """ModelMetadata's and ModelConfig's checks (the 404 of a model outside the key's --models included);
        whether the model is a media model."""
        door = await key_checked(context, METADATA, GRPC)
        self._check_model(request.name, request.version)
        door.check_model(request.name)
        return self._media_card(request.name) is not None

    async def ModelMetadata(self, request, context):
        return metadata.model_metadata(request.name, await self._described(request, context))

    async def ModelConfig(self, request, context):
        return metadata.model_config(request.name, await self._described(request, context))

    async def _start_generation(self, request, context: grpc.aio.ServicerContext | None, rid: str, *,
                                unary: bool, call_headers: dict[str, str]) -> Generation:
        """Parses, checks the model and starts the pipeline (lazily: nothing runs before iteration)."""
        parsed = parse_request(request, call_headers)
        self._check_model(request.model_name, request.model_version)
        if unary and parsed.stream:
            raise InvalidRequest("ModelInfer returns one response; use ModelStreamInfer to stream", param="stream")
        req = parsed.parsed
        prep = [chat_to_preprocess(req, rid) if isinstance(req, ChatRequest)
                else completion_to_preprocess(req, req.prompts[0], rid)]
        log.debug("kserve request %r runs as %s", request.id, rid)
        renderer = InferResponseBuilder(request.model_name, request.id, parsed.outputs, decoupled=not unary,
                                        empty_final=parsed.empty_final and not unary)
        streaming = not unary and parsed.stream is not False  # ModelStreamInfer streams unless told not to
        stream = self._pipeline.run(prep, req.n, req.worker_id, req.route_hints(),
                                    options=postprocess_options(req, prep[0]))
        return Generation(req.model, streaming, renderer, stream)

    async def ModelInfer(self, request, context):
        card = self._media_card(request.model_name)
        if card is not None and self._media is not None:
            return await self._media.infer(request, card, context, decoupled=False)
        served = _serve(self, request, context, unary=True)
        try:
            return (await anext(served))[0]  # unary: the one folded response (or the front door aborts)
        finally:
            await served.aclose()  # ends the request's books now, not when the generator is collected

    async def _serve_one(self, request, context: grpc.aio.ServicerContext, put: Callable) -> None:
        """Answers one request of a ModelStreamInfer call; errors become its error_message."""
        try:
            card = self._media_card(request.model_name)
            if card is not None and self._media is not None:
                await put(await self._media.infer(request, card, None, decoupled=True, call_headers=headers(context)))
                return
            async for responses in _serve(self, request, context, unary=False):
                for response in responses:
                    await put(response)
        except MeshError as e:
            log.info("kserve stream request %r failed: %s", request.id, e.message)
            await put(error_response(e))

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


# Every KServe call's answer while it is off (--no-kserve-grpc-server).
KSERVE_OFF = ("KServe v2 gRPC (inference.GRPCInferenceService) is off on this gateway; start it with "
              "--kserve-grpc-server (env DYN_KSERVE_GRPC_SERVER=true)")


async def _off(request, context: grpc.aio.ServicerContext) -> None:
    """Any KServe RPC while the protocol is off: UNIMPLEMENTED, as for a service never registered, but saying
    which flag serves it (a bare "Method not found!" would send the operator looking for a routing fault)."""
    await context.abort(grpc.StatusCode.UNIMPLEMENTED, KSERVE_OFF)


def add_to_server(servicer: KServeServicer, server: grpc.aio.Server, *, enabled: bool = True) -> None:
    """Registers the servicer for every RPC in protos/inference (others answer UNIMPLEMENTED); not
    ``enabled``: every RPC answers UNIMPLEMENTED naming the flag, and the servicer is never called."""
    handlers = {}
    for name, (req_cls, resp_cls, client_streaming, server_streaming) in protocol.METHODS.items():
        kind = {(False, False): grpc.unary_unary_rpc_method_handler,
                (True, True): grpc.stream_stream_rpc_method_handler}[(client_streaming, server_streaming)]
        handlers[name] = kind(getattr(servicer, name) if enabled else _off, request_deserializer=req_cls.FromString,
                              response_serializer=resp_cls.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(protocol.SERVICE, handlers),))
    if hasattr(server, "add_registered_method_handlers"):
        server.add_registered_method_handlers(protocol.SERVICE, handlers)
