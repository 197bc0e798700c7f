"""One KServe request to a media model: parse (media.py), generate over the media spine, one response.

The outputs are gathered whole (a tensor response is one message; the gateway's gRPC limit, 64 MiB,
bounds it), one BYTES element per output. The front door's unary shape (services/gateway/front_door.py
``serve_unary``) runs its lifecycle in KServe's error shape (the status alone); metrics count it under
endpoint ``kserve`` like text requests.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from services.common.discovery import ModelCard
from services.common.errors import WorkerFailed
from services.gateway.front_door import GRPC, Reply, Started, serve_unary
from services.gateway.kserve import protocol
from services.gateway.kserve.media import parse_media
from services.gateway.kserve.render import FINAL, MODEL_VERSION
from services.gateway.kserve.request import parameter_values
from services.gateway.kserve.tensors import bytes_output
from services.gateway.media.runner import MediaRunner, close_events

ENDPOINT = "kserve"


class MediaInfer:
    def __init__(self, media: MediaRunner, check_model: Callable[[str, str], None]):
        self._media = media
        self._check_model = check_model

    async def infer(self, request, card: ModelCard, context, *, decoupled: bool,
                    call_headers: dict[str, str] | None = None):
        """The response; an error aborts ``context`` (ModelInfer) or is raised (a ModelStreamInfer request,
        whose key is the stream's: ``call_headers``)."""
        answer = functools.partial(MediaInfer._answer, card=card, decoupled=decoupled)
        return await serve_unary(self, answer, ENDPOINT, GRPC, True, request, context, call_headers=call_headers)

    async def _answer(self, request, context, rid: str, started: Started, *, card: ModelCard,
                      decoupled: bool) -> Reply:
        self._check_model(request.model_name, request.model_version)
        req = parse_media(request, card, parameter_values(request.parameters), rid)
        started(card.name)
        resp = await self._generate(request, req)
        if decoupled:
            resp.parameters[FINAL].bool_param = True
        return Reply(resp)

    async def _generate(self, request, req):
        outputs = [bytearray() for _ in range(req.n)]
        done = None
        events = self._media.run(req)
        try:
            async for ev in events:
                kind = ev.WhichOneof("event")
                if kind == "chunk":
                    if ev.chunk.index >= req.n:
                        raise WorkerFailed(f"the media worker sent output {ev.chunk.index} of {req.n}")
                    outputs[ev.chunk.index] += ev.chunk.data
                elif kind == "done":
                    done = ev.done
        finally:
            await close_events(events)
        if done is None or not all(outputs):
            raise WorkerFailed("the media worker ended without every output")
        resp = protocol.ModelInferResponse(model_name=request.model_name, model_version=MODEL_VERSION, id=request.id)
        bytes_output(resp, "output", [bytes(o) for o in outputs])
        resp.parameters["content_type"].string_param = done.content_type
        resp.parameters["seed"].int64_param = req.seed
        resp.parameters["inference_time_s"].double_param = done.inference_time_s
        if done.num_frames:
            resp.parameters["num_frames"].int64_param = done.num_frames
            resp.parameters["fps"].double_param = done.fps
        return resp
