"""gRPC glue for the Images API: ``ImagesService.Generations`` and ``Edits`` (HttpBody in, stream HttpBody out).

The lifecycle is the front door's (services/gateway/front_door.py), over media events instead of token
deltas: parse, check the model (an image model), check the request against its limits, run the media
pipeline, and hold the response back until the answer's first bytes, so that a failure before them
(routing, a worker that fails, a bad input the worker refuses) is a real status in OpenAI's shape, an
overload a 503 with Retry-After. After the first bytes a streamed answer reports a failure in-band; a
JSON body can only be cut off. A client that hangs up cancels this call, which closes the pipeline and
so the worker's call: its denoising loop stops at the next step.

Each message carries at most ``MESSAGE_BYTES``: Envoy's transcoder writes each into the one HTTP body
as it comes, so a large image never sits whole in one message.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable

import grpc
from google.api import httpbody_pb2
from meshfront.gateway.v1 import images_pb2_grpc

from services.common.discovery import IMAGES, MediaLimits
from services.common.errors import MeshError
from services.gateway.front_door import JSON, OPENAI, SSE, Models, check_model, headers, unexpected
from services.gateway.images.render import ImagesAnswer
from services.gateway.images.request import ImageRequest, parse_edit, parse_generation, resolve
from services.gateway.media.pipeline import MediaPipeline
from services.gateway.media.store import MediaStore, media_url
from services.gateway.request_metrics import RequestTracker

MESSAGE_BYTES = 512 * 1024
Parse = Callable[[httpbody_pb2.HttpBody], ImageRequest]


def _pieces(data: bytes) -> list[bytes]:
    return [data[i:i + MESSAGE_BYTES] for i in range(0, len(data), MESSAGE_BYTES)] or [b""]


class ImagesServicer(images_pb2_grpc.ImagesServiceServicer):
    def __init__(self, pipeline: MediaPipeline, models: Models, store: MediaStore, public_url: str = ""):
        self._pipeline = pipeline
        self._models = models
        self._store = store
        self._public_url = public_url

    def _start(self, request: httpbody_pb2.HttpBody, context: grpc.aio.ServicerContext, parse: Parse,
               request_id: str, edit: bool) -> tuple[ImageRequest, ImagesAnswer, AsyncGenerator[bytes, None]]:
        """Parses and checks the request and starts it; nothing runs before the answer is iterated."""
        req = parse(request)
        models = self._models()
        check_model(models, req.model, media=IMAGES)
        card = models[req.model][0].model
        limits = card.media if card.media is not None else MediaLimits()  # a card without limits: the defaults
        job = resolve(req, limits, request_id)
        answer = ImagesAnswer(req, job.width, job.height, edit=edit)
        events = self._pipeline.run(job)
        if req.stream:
            return req, answer, answer.sse(events)
        if req.response_format == "url":
            http_headers = headers(context)

            async def store(chunks: AsyncIterator[bytes], content_type: str) -> str:
                return media_url(await self._store.put(chunks, content_type), self._public_url, http_headers)

            return req, answer, answer.url_body(events, store)
        return req, answer, answer.b64_body(events)

    async def _serve(self, endpoint: str, parse: Parse, request: httpbody_pb2.HttpBody,
                     context: grpc.aio.ServicerContext) -> AsyncIterator[httpbody_pb2.HttpBody]:
        request_id = uuid.uuid4().hex
        with RequestTracker(endpoint) as track:
            err: MeshError
            try:
                req, answer, out = self._start(request, context, parse, request_id, endpoint == "images_edits")
                track.start(req.model, req.stream)
                first = await anext(out)
            except MeshError as e:
                err = e
            except Exception:  # noqa: BLE001 - a bug still gets OpenAI's shape, and is logged
                err = unexpected(endpoint, request_id)
            else:
                try:
                    if req.stream:
                        track.first_token()
                    content_type = SSE if req.stream else JSON
                    for piece in _pieces(first):
                        yield httpbody_pb2.HttpBody(content_type=content_type, data=piece)
                    async for data in out:
                        for piece in _pieces(data):
                            yield httpbody_pb2.HttpBody(data=piece)
                    track.finish(answer.input_tokens, answer.output_tokens, 0)
                    return
                except MeshError as e:
                    err = e
                except Exception:  # noqa: BLE001 - reported like any other failure
                    err = unexpected(f"{endpoint} answer", request_id)
                finally:
                    await out.aclose()  # cancels the worker's call if it still runs
                track.fail(err, mid_stream=True)
                if req.stream:
                    yield httpbody_pb2.HttpBody(data=answer.sse_error(err))
                    return
                await OPENAI.abort(context, err)  # the body is cut off: the client sees a broken transfer
            track.fail(err)
            await OPENAI.abort(context, err)

    # The RPCs: ``_serve`` itself with the endpoint's arguments bound, so each stays an async generator
    # function (what the error interceptor drives), as front_door.generation_rpc does.
    Generations = functools.partialmethod(_serve, "images", lambda body: parse_generation(body.data))
    Edits = functools.partialmethod(_serve, "images_edits", lambda body: parse_edit(body.data, body.content_type))
