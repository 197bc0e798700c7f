"""gRPC glue for the Videos API: ``VideosService`` (HttpBody in, HttpBody out), behind Envoy's transcoder.

POST /v1/videos takes two shapes (request.py ``is_sync_shape``; docs/media.md): OpenAI's job create,
answered with the job at once (jobs.py runs it), or Dynamo's synchronous request, answered like
POST /v1/videos/generations once the video exists. The front door (services/gateway/front_door.py) runs
each RPC's lifecycle: a video and a download in its stream shape, the job routes in its unary one. Errors
before the first byte abort in OpenAI's shape (Envoy's Lua filter makes them the HTTP status and body; an
overload is 503 with Retry-After); after it, a streamed request gets an in-band error event, and a
non-streamed one's call ends with an error status, leaving its JSON body unfinished (unparseable) rather
than a truncated video in a whole answer.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence

import grpc
from google.api import httpbody_pb2
from meshfront.gateway.v1 import videos_pb2_grpc

from services.common.discovery import VIDEOS, WorkerCard
from services.common.errors import InvalidRequest, MeshError, NotFound
from services.gateway.core.errors import sse_error_frame
from services.gateway.front_door import (
    JSON,
    SSE,
    Models,
    Reply,
    Started,
    check_model,
    headers,
    unary_rpc,
)
from services.gateway.front_door_stream import Streamed, stream_rpc
from services.gateway.media.base64_stream import Base64Stream
from services.gateway.media.runner import CONTENT_TYPES, MediaBlobs, MediaRunner, VideoRun
from services.gateway.media.video_spec import VideoParams, VideoSpec, media_request, resolve
from services.gateway.videos import render
from services.gateway.videos.jobs import VideoJobs
from services.gateway.videos.request import is_sync_shape, parse_openai, parse_openai_json, parse_sync

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


def _json(body: bytes) -> Reply:
    return Reply(httpbody_pb2.HttpBody(content_type=JSON, data=body))


def _sse_error(err: MeshError) -> bytes:
    """A streamed video's failure after its first event (the status is sent): an in-band error event."""
    return b"\n\n" + sse_error_frame(err)


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
        # An async generator itself (the error interceptor tells streaming handlers apart by that): one
        # route, two shapes, each served by the front door under its own endpoint in /metrics.
        serve = self._generate if is_sync_shape(request.data, request.content_type) else self._create_job
        async for message in serve(request, context):
            yield message

    async def _start_job(self, request: httpbody_pb2.HttpBody, context: grpc.aio.ServicerContext,
                         request_id: str) -> Streamed:
        """OpenAI's job create: checked here, submitted when the front door asks for the answer."""
        ctype = request.content_type.split(";")[0].strip().lower()
        if ctype == "multipart/form-data":
            params = parse_openai(*self._parse_form(request.data, request.content_type))
        elif ctype in ("application/json", ""):
            params = parse_openai_json(request.data)
        else:
            raise InvalidRequest(f"POST /v1/videos takes multipart/form-data or application/json, not {ctype!r}")
        spec = self._spec(params)
        return Streamed(self._submit(spec), JSON, spec.model)

    async def _submit(self, spec: VideoSpec) -> AsyncGenerator[bytes, None]:
        yield render.job_body(await self._jobs.submit(spec))

    async def _start_generation(self, request: httpbody_pb2.HttpBody, context: grpc.aio.ServicerContext,
                                request_id: str) -> Streamed:
        """Dynamo's synchronous shape: generate now, answer with the video (its URL or its base64)."""
        params = parse_sync(request.data)
        spec = self._spec(params)
        body = render.SyncBody(f"video_{request_id}", spec.model, int(time.time()), spec.output_format, spec.fps)
        run = VideoRun(self._media.run(media_request(spec, request_id)))
        answer = self._video(params, spec, body, run, headers(context))
        if params.stream:
            return Streamed(answer, SSE, spec.model, sse=True, sse_error=_sse_error)
        return Streamed(answer, JSON, spec.model)

    async def _video(self, params: VideoParams, spec: VideoSpec, body: render.SyncBody, run: VideoRun,
                     http_headers: Mapping[str, str]) -> AsyncGenerator[bytes, None]:
        """The answer's bytes: progress events (streamed), then the video object, its base64 as it comes."""
        try:
            async for step, total in run.progress():
                if params.stream and total:
                    yield body.progress_event(min(99, 100 * step // total))
            lead = b"data: " if params.stream else b""
            if params.response_format == "url":
                media_id = await self._blobs.put(run.chunks(), CONTENT_TYPES[spec.output_format], self._ttl_s)
                url = self._url_for(http_headers, media_id)
                yield lead + body.head("url") + body.url_value(url) + self._tail(body, run, False)
            else:
                yield lead + body.head("b64_json")
                b64 = Base64Stream()
                async for chunk in run.chunks():
                    yield b64.feed(chunk)
                yield b64.end() + self._tail(body, run, True)
            if params.stream:
                yield b"\n\ndata: [DONE]\n\n"
        finally:
            await run.aclose()

    _create_job = stream_rpc(_start_job, "videos")
    _generate = stream_rpc(_start_generation, "videos_generations")
    GenerateVideo = _generate

    @staticmethod
    def _tail(body: render.SyncBody, run: VideoRun, b64: bool) -> bytes:
        assert run.done is not None  # chunks() ends only once it has read the worker's done
        return body.tail(run.done.inference_time_s, b64=b64)

    async def _record(self, video_id: str) -> dict:
        entry = await self._jobs.store.get(video_id)
        if entry is None:
            raise _not_found(video_id)
        return entry.record

    async def _get(self, request, context: grpc.aio.ServicerContext, request_id: str, started: Started) -> Reply:
        return _json(render.job_body(await self._record(request.video_id)))

    async def _list(self, request, context: grpc.aio.ServicerContext, request_id: str, started: Started) -> Reply:
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
        page = records[start:start + limit]
        return _json(render.list_body(page, has_more=start + limit < len(records)))

    async def _delete(self, request, context: grpc.aio.ServicerContext, request_id: str, started: Started) -> Reply:
        if not await self._jobs.delete(request.video_id):
            raise _not_found(request.video_id)
        return _json(render.deleted_body(request.video_id))

    async def _open_content(self, request, context: grpc.aio.ServicerContext, request_id: str) -> Streamed:
        variant = request.variant or "video"
        if variant not in VARIANTS:
            raise InvalidRequest(f"'variant' must be one of {', '.join(VARIANTS)}; got {variant!r}", param="variant")
        if variant != "video":
            raise InvalidRequest(f"the {variant} variant is not served here; download variant=video", param="variant")
        record = await self._record(request.video_id)
        if record["status"] != "completed":
            raise InvalidRequest(f"Video {request.video_id} is {record['status']}; its content is ready once "
                                 "its status is completed", param="video_id")
        content_type, _, chunks = await self._blobs.open(record["media_id"])
        return Streamed(chunks, content_type)

    # The job routes and the download are not requests /metrics counts (``counted``), as they never were.
    GetVideo = unary_rpc(_get, "video get", counted=False)
    ListVideos = unary_rpc(_list, "video list", counted=False)
    DeleteVideo = unary_rpc(_delete, "video delete", counted=False)
    DownloadVideoContent = stream_rpc(_open_content, "video download", counted=False)
