"""One KServe request to a media model: parse (media.py), generate over the media spine, one response.

The outputs are gathered whole (a tensor response is one message; the gateway's gRPC limit, 64 MiB,
bounds it), one BYTES element per output. Metrics count it under endpoint ``kserve`` like text requests.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from services.common.discovery import ModelCard
from services.common.errors import MeshError, WorkerFailed
from services.gateway.front_door import GRPC, unexpected
from services.gateway.kserve import protocol
from services.gateway.kserve.media import parse_media
from services.gateway.kserve.render import FINAL, MODEL_VERSION
from services.gateway.kserve.request import parameter_values
from services.gateway.kserve.tensors import bytes_output
from services.gateway.media.runner import MediaRunner, close_events
from services.gateway.request_metrics import RequestTracker

ENDPOINT = "kserve"


class MediaInfer:
    def __init__(self, media: MediaRunner, check_model: Callable[[str, str], None]):
        self._media = media
        self._check_model = check_model

    async def infer(self, request, card: ModelCard, context, *, decoupled: bool):
        """The response; an error aborts ``context`` (ModelInfer) or is raised (a ModelStreamInfer request)."""
        rid = uuid.uuid4().hex
        with RequestTracker(ENDPOINT) as track:
            try:
                self._check_model(request.model_name, request.model_version)
                req = parse_media(request, card, parameter_values(request.parameters), rid)
                track.start(card.name, False)
                resp = await self._generate(request, req)
                if decoupled:
                    resp.parameters[FINAL].bool_param = True
                track.finish(0, 0, 0)
                return resp
            except MeshError as e:
                err: MeshError = e
            except Exception:  # noqa: BLE001 - a bug still gets a status, and is logged
                err = unexpected("kserve media", rid)
            track.fail(err)
            await GRPC.abort(context, err)

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
