"""gRPC glue for the Videos API: ``VideosService`` (HttpBody in, HttpBody out), behind Envoy's transcoder.

POST /v1/videos takes two shapes (request.py ``is_sync_shape``; docs/media.md): OpenAI's job create,
answered with the job at once (jobs.py runs it), or Dynamo's synchronous request, answered like
POST /v1/videos/generations once the video exists. Errors before the first byte abort in OpenAI's
shape (Envoy's Lua filter makes them the HTTP status and body; an overload is 503 with Retry-After);
after it, a streamed request gets an in-band error event, and a non-streamed one's call ends with an
error status, leaving its JSON body unfinished (unparseable) rather than a truncated video in a whole answer.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

import grpc
from google.api import httpbody_pb2
from meshfront.gateway.v1 import videos_pb2_grpc

from services.common.discovery import VIDEOS, WorkerCard
from services.common.errors import InvalidRequest, MeshError, NotFound
from services.gateway.core.errors import sse_error_frame
from services.gateway.front_door import JSON, OPENAI, SSE, Models, check_model, headers, unexpected
from services.gateway.media.base64_stream import Base64Stream
from services.gateway.media.runner import CONTENT_TYPES, MediaBlobs, MediaRunner, VideoRun
from services.gateway.media.video_spec import VideoParams, VideoSpec, media_request, resolve
from services.gateway.request_metrics import RequestTracker
from services.gateway.videos import render
from services.gateway.videos.jobs import VideoJobs
from services.gateway.videos.request import is_sync_shape, parse_openai, parse_openai_json, parse_sync

log = logging.getLogger(__name__)
# (body, content type) -> (text fields, file parts): services/gateway/media/multipart.py.
FormParser = Callable[[bytes, str], tuple[dict[str, str], dict[str, bytes]]]
# (the call's headers, media id) -> the URL that serves it (GET /v1/media/{id}).
UrlFor = Callable[[Mapping[str, str], str], str]
VARIANTS = ("video", "thumbnail", "spritesheet")
MAX_PAGE = 100


def check_video_model(models: Mapping[str, Sequence[WorkerCard]], name: str) -> None:
    """A 404 for an unknown model, a 400 for one that does not make videos (front_door.check_model)."""
    check_model(models, name, media=VIDEOS)
    if models[name][0].model.media is None:  # a card that says videos but not its limits: nothing to check against
        raise InvalidRequest(f"The model `{name}` announces no video limits; its worker must register them",
                             param="model")


def _not_found(video_id: str) -> NotFound:
    return NotFound(f"Video with id '{video_id}' not found (never created, deleted or expired).", param="video_id")


def _limit(raw: str) -> int:
    if raw == "":
        return 20
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_PAGE:
        raise InvalidRequest(f"'limit' must be an integer from 1 to {MAX_PAGE}; got {raw!r}", param="limit")
    return int(raw)


class VideosServicer(videos_pb2_grpc.VideosServiceServicer):
    def __init__(self, jobs: VideoJobs, media: MediaRunner, blobs: MediaBlobs, models: Models,
                 parse_form: FormParser, url_for: UrlFor, ttl_s: int):
        self._jobs = jobs
        self._media = media
        self._blobs = blobs
        self._models = models
        self._parse_form = parse_form
        self._url_for = url_for
        self._ttl_s = ttl_s

    def _spec(self, params: VideoParams) -> VideoSpec:
        models = self._models()
        check_video_model(models, params.model)
        limits = models[params.model][0].model.media
        assert limits is not None  # check_video_model refuses a card without limits
        return resolve(params, limits)

    async def CreateVideo(self, request: httpbody_pb2.HttpBody,
                          context: grpc.aio.ServicerContext) -> AsyncIterator[httpbody_pb2.HttpBody]:
        if is_sync_shape(request.data, request.content_type):
            async for message in self._generate(parse_sync, request, context):
                yield message
            return
        with RequestTracker("videos") as track:
            try:
                ctype = request.content_type.split(";")[0].strip().lower()
                if ctype == "multipart/form-data":
                    params = parse_openai(*self._parse_form(request.data, request.content_type))
                elif ctype in ("application/json", ""):
                    params = parse_openai_json(request.data)
                else:
                    raise InvalidRequest(f"POST /v1/videos takes multipart/form-data or application/json, not "
                                         f"{ctype!r}")
                spec = self._spec(params)
                track.start(spec.model, False)
                record = await self._jobs.submit(spec)
                track.finish(0, 0, 0)
            except MeshError as e:
                err: MeshError = e
            except Exception:  # noqa: BLE001 - a bug still gets OpenAI's shape, and is logged
                err = unexpected("videos", "create")
            else:
                yield httpbody_pb2.HttpBody(content_type=JSON, data=render.job_body(record))
                return
            track.fail(err)
            await OPENAI.abort(context, err)

    async def GenerateVideo(self, request: httpbody_pb2.HttpBody,
                            context: grpc.aio.ServicerContext) -> AsyncIterator[httpbody_pb2.HttpBody]:
        # An async generator itself: the error interceptor tells streaming handlers apart by that.
        async for message in self._generate(parse_sync, request, context):
            yield message

    async def _generate(self, parse: Callable[[bytes], VideoParams], request: httpbody_pb2.HttpBody,
                        context: grpc.aio.ServicerContext) -> AsyncIterator[httpbody_pb2.HttpBody]:
        """Dynamo's synchronous shape: generate now, answer with the video (its URL or its base64)."""
        rid = uuid.uuid4().hex
        with RequestTracker("videos_generations") as track:
            run: VideoRun | None = None
            sent = streaming = False
            try:
                params = parse(request.data)
                streaming = params.stream
                spec = self._spec(params)
                track.start(spec.model, params.stream)
                body = render.SyncBody(f"video_{rid}", spec.model, int(time.time()), spec.output_format, spec.fps)
                run = VideoRun(self._media.run(media_request(spec, rid)))
                ctype = SSE if params.stream else JSON
                async for step, total in run.progress():
                    if params.stream and total:
                        sent = True
                        track.first_token()
                        yield httpbody_pb2.HttpBody(content_type=SSE,
                                                    data=body.progress_event(min(99, 100 * step // total)))
                lead = b"data: " if params.stream else b""
                if params.response_format == "url":
                    media_id = await self._blobs.put(run.chunks(), CONTENT_TYPES[spec.output_format], self._ttl_s)
                    url = self._url_for(headers(context), media_id)
                    data = lead + body.head("url") + body.url_value(url)
                    yield httpbody_pb2.HttpBody(content_type=ctype, data=data + self._tail(body, run, False))
                else:
                    sent = True
                    yield httpbody_pb2.HttpBody(content_type=ctype, data=lead + body.head("b64_json"))
                    b64 = Base64Stream()
                    async for chunk in run.chunks():
                        yield httpbody_pb2.HttpBody(content_type=ctype, data=b64.feed(chunk))
                    yield httpbody_pb2.HttpBody(content_type=ctype, data=b64.end() + self._tail(body, run, True))
                if params.stream:
                    yield httpbody_pb2.HttpBody(content_type=SSE, data=b"\n\ndata: [DONE]\n\n")
                track.finish(0, 0, 0)
                return
            except MeshError as e:
                err: MeshError = e
            except Exception:  # noqa: BLE001 - a bug still gets OpenAI's shape, and is logged
                err = unexpected("videos generations", rid)
            finally:
                if run is not None:
                    await run.aclose()
            track.fail(err, mid_stream=sent)
            if sent and streaming:
                yield httpbody_pb2.HttpBody(content_type=SSE, data=b"\n\n" + sse_error_frame(err))
                return
            if sent:  # a JSON body already half sent: end the call with an error, never close the JSON
                log.warning("video request %s failed mid-body: %s", rid, err.message)
                await context.abort(grpc.StatusCode.ABORTED, "the video failed mid-transfer")
            await OPENAI.abort(context, err)

    @staticmethod
    def _tail(body: render.SyncBody, run: VideoRun, b64: bool) -> bytes:
        assert run.done is not None  # chunks() ends only once it has read the worker's done
        return body.tail(run.done.inference_time_s, b64=b64)

    async def _record(self, video_id: str) -> dict:
        entry = await self._jobs.store.get(video_id)
        if entry is None:
            raise _not_found(video_id)
        return entry.record

    async def GetVideo(self, request, context: grpc.aio.ServicerContext) -> httpbody_pb2.HttpBody:
        try:
            record = await self._record(request.video_id)
        except MeshError as e:
            await OPENAI.abort(context, e)
        return httpbody_pb2.HttpBody(content_type=JSON, data=render.job_body(record))

    async def ListVideos(self, request, context: grpc.aio.ServicerContext) -> httpbody_pb2.HttpBody:
        try:
            limit = _limit(request.limit)
            if request.order not in ("", "asc", "desc"):
                raise InvalidRequest(f"'order' must be asc or desc; got {request.order!r}", param="order")
            records = sorted((e.record for e in await self._jobs.store.all()),
                             key=lambda r: (r["created"], r["id"]), reverse=request.order != "asc")
            start = 0
            if request.after:
                ids = [r["id"] for r in records]
                if request.after not in ids:
                    raise InvalidRequest(f"'after': no video with id {request.after!r}", param="after")
                start = ids.index(request.after) + 1
        except MeshError as e:
            await OPENAI.abort(context, e)
        page = records[start:start + limit]
        body = render.list_body(page, has_more=start + limit < len(records))
        return httpbody_pb2.HttpBody(content_type=JSON, data=body)

    async def DeleteVideo(self, request, context: grpc.aio.ServicerContext) -> httpbody_pb2.HttpBody:
        try:
            if not await self._jobs.delete(request.video_id):
                raise _not_found(request.video_id)
        except MeshError as e:
            await OPENAI.abort(context, e)
        return httpbody_pb2.HttpBody(content_type=JSON, data=render.deleted_body(request.video_id))

    async def DownloadVideoContent(self, request,
                                   context: grpc.aio.ServicerContext) -> AsyncIterator[httpbody_pb2.HttpBody]:
        try:
            variant = request.variant or "video"
            if variant not in VARIANTS:
                raise InvalidRequest(f"'variant' must be one of {', '.join(VARIANTS)}; got {variant!r}",
                                     param="variant")
            if variant != "video":
                raise InvalidRequest(f"the {variant} variant is not served here; download variant=video",
                                     param="variant")
            record = await self._record(request.video_id)
            if record["status"] != "completed":
                raise InvalidRequest(f"Video {request.video_id} is {record['status']}; its content is ready once "
                                     "its status is completed", param="video_id")
            content_type, _, chunks = await self._blobs.open(record["media_id"])
        except MeshError as e:
            await OPENAI.abort(context, e)
        async for chunk in chunks:
            yield httpbody_pb2.HttpBody(content_type=content_type, data=chunk)
