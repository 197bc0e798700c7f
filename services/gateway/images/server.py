"""gRPC glue for the Images API: ``ImagesService.Generations`` and ``Edits`` (HttpBody in, stream HttpBody out).

The lifecycle is the front door's stream shape (services/gateway/front_door.py ``stream_rpc``), over
the worker's media events instead of token deltas: ``_start`` parses, checks the model (an image model)
and the request against its limits, and starts the media pipeline; the front door holds the response
back until the answer's first bytes, so that a failure before them (routing, a worker that fails, a bad
input the worker refuses) is a real status in OpenAI's shape, an overload a 503 with Retry-After. After
the first bytes a streamed answer reports a failure in-band; a JSON body can only be cut off. A client
that hangs up cancels this call, which closes the pipeline and so the worker's call: its denoising loop
stops at the next step.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable

import grpc
from google.api import httpbody_pb2
from meshfront.gateway.v1 import images_pb2_grpc

from services.common.discovery import IMAGES, MediaLimits
from services.gateway.front_door import JSON, SSE, Models, check_model, headers
from services.gateway.front_door_stream import Streamed, stream_rpc
from services.gateway.images.render import ImagesAnswer
from services.gateway.images.request import ImageRequest, parse_edit, parse_generation, resolve
from services.gateway.media.pipeline import MediaPipeline
from services.gateway.media.store import MediaStore, media_url

Parse = Callable[[httpbody_pb2.HttpBody], ImageRequest]


class ImagesServicer(images_pb2_grpc.ImagesServiceServicer):
    def __init__(self, pipeline: MediaPipeline, models: Models, store: MediaStore, public_url: str = ""):
        self._pipeline = pipeline
        self._models = models
        self._store = store
        self._public_url = public_url

    async def _start(self, request: httpbody_pb2.HttpBody, context: grpc.aio.ServicerContext, request_id: str, *,
                     parse: Parse, edit: bool) -> Streamed:
        """Parses and checks the request and starts it; nothing runs before the answer is iterated."""
        req = parse(request)
        models = self._models()
        check_model(models, req.model, media=IMAGES)
        card = models[req.model][0].model
        limits = card.media if card.media is not None else MediaLimits()  # a card without limits: the defaults
        job = resolve(req, limits, request_id)
        answer = ImagesAnswer(req, job.width, job.height, edit=edit)
        events = self._pipeline.run(job)

        def tokens() -> tuple[int, int, int]:
            return answer.input_tokens, answer.output_tokens, 0

        if req.stream:
            return Streamed(answer.sse(events), SSE, req.model, sse=True, sse_error=answer.sse_error, tokens=tokens)
        if req.response_format == "url":
            http_headers = headers(context)

            async def store(chunks: AsyncIterator[bytes], content_type: str) -> str:
                return media_url(await self._store.put(chunks, content_type), self._public_url, http_headers)

            return Streamed(answer.url_body(events, store), JSON, req.model, tokens=tokens)
        return Streamed(answer.b64_body(events), JSON, req.model, tokens=tokens)

    Generations = stream_rpc(functools.partial(_start, parse=lambda body: parse_generation(body.data), edit=False),
                             "images")
    Edits = stream_rpc(functools.partial(_start, parse=lambda body: parse_edit(body.data, body.content_type),
                                         edit=True), "images_edits")
