"""The front door every front end shares: headers, the model check, the abort, and one request's lifecycle.

A front end (openai/, anthropic/, responses_api/, embeddings/, images/, videos/, kserve/) brings three
things: its ``request.py`` (body -> request type), its ``render.py`` (its wire shape) and its
``server.py``, whose RPCs hand the front door a callable that parses, checks and starts the request.
The lifecycle comes in three shapes, one per kind of answer:

- ``generation_rpc`` / ``serve_generation``: token deltas through a ``Renderer`` (chat, completions,
  Responses, Messages, KServe's text models);
- ``stream_rpc`` / ``serve_stream`` (front_door_stream.py): any answer that is bytes in pieces
  (``Streamed``: an image or video answer, a stored file);
- ``unary_rpc`` / ``serve_unary``: one request, one message (``Reply``: embeddings, a token count, a
  video job, KServe's media models).

Everything else happens here, once:

- before the first byte, an error aborts the call in the caller's shape (``ErrorShape``): for HTTP,
  a gRPC status plus ``x-meshfront-status`` / ``x-meshfront-body`` trailers that Envoy's Lua filter
  turns into the HTTP status and body (OpenAI's or Anthropic's); for KServe, the status alone;
- a non-streamed request folds every delta, then sends one body;
- a streamed one sends its first bytes with its first tokens (so routing and worker-start failures
  keep a real status), then one frame per batch, then the end; a failure after the first byte is the
  renderer's in-band error frame, since the status is already sent;
- a bug (any other exception) is logged and answered as a 500 in the same shape (``as_mesh_error``);
- the request's metrics (``RequestTracker``) are recorded exactly once, however it ends; requests the
  metrics do not count (a download, a token count) run the same lifecycle untracked;
- with ``--auth``, the caller's key is checked before anything else (401), and the request's ``auth.Admission``
  follows it to its end: quotas (429), token charges, the key's models (the 404 of an unknown model), and a
  limited key's rate-limit headers with the first bytes or the error (services/gateway/auth/admission.py).

Nothing here runs per token: one ``if`` per batch, and the renderer's pre-rendered bytes go out as
they are.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, NoReturn, Protocol

import grpc
from google.api import httpbody_pb2

from services.common import debug_perf, tracing
from services.common.debug_perf import StagePerf
from services.common.discovery import IMAGES, VIDEOS, WorkerCard
from services.common.errors import Internal, InvalidRequest, MeshError, NotFound, Overloaded, to_status
from services.gateway import auth, scheduling
from services.gateway.core import errors as openai_errors
from services.gateway.core.delta import Delta
from services.gateway.request_metrics import RequestTracker, tracker
from services.gateway.timed_renderer import TimedRenderer

log = logging.getLogger(__name__)
JSON = "application/json"
SSE = "text/event-stream"
Models = Callable[[], dict[str, list[WorkerCard]]]


def headers(context: grpc.aio.ServicerContext) -> dict[str, str]:
    """The call's text metadata: the HTTP request headers Envoy forwarded (binary ``-bin`` keys left out)."""
    return {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}


# Where each media kind is served, for the 400 that sends a client to the right endpoint.
MEDIA_ROUTES = {IMAGES: "/v1/images/generations or /v1/images/edits", VIDEOS: "/v1/videos"}
_MEDIA_NAMES = {IMAGES: "an image", VIDEOS: "a video"}


def check_model(models: Mapping[str, Sequence[WorkerCard]], name: str, *, embedding: bool = False,
                media: str | None = None, param: str = "model") -> None:
    """A 404 for a model nobody serves; a 400 for one of another kind than the endpoint's: generation
    (the default), embedding (``embedding``), or a media kind (``media``: IMAGES or VIDEOS)."""
    cards = models.get(name)
    if not cards:
        # NotFound (reason NOT_FOUND), as /metrics has always counted the gateway's unknown models.
        raise NotFound(f"The model `{name}` does not exist.", param=param, code="model_not_found")
    card = cards[0].model
    served = next((kind for kind in MEDIA_ROUTES if card.serves(kind)), None)
    where = (MEDIA_ROUTES[served] if served else "/v1/embeddings" if card.is_embedding
             else "/v1/chat/completions or /v1/completions")
    if media is not None:
        if served != media:
            raise InvalidRequest(f"The model `{name}` is not {_MEDIA_NAMES[media]} model; use {where} with it",
                                 param=param)
    elif served is not None:
        raise InvalidRequest(f"The model `{name}` is {_MEDIA_NAMES[served]} model; use {where} with it", param=param)
    elif card.is_embedding and not embedding:
        raise InvalidRequest(f"The model `{name}` is an embedding model; use /v1/embeddings with it", param=param)
    elif embedding and not card.is_embedding:
        raise InvalidRequest(f"The model `{name}` is not an embedding model; use {where} with it", param=param)


def http_trailers(status: int, body: bytes) -> tuple[tuple[str, str], ...]:
    """What Envoy's Lua filter turns into the HTTP status and body of a call that ends without one."""
    text = body.decode()
    if not text.isascii():  # a trailer cannot carry a model id like "café": \u-escape it, as JSON allows
        text = json.dumps(json.loads(text), ensure_ascii=True)
    return ("x-meshfront-status", str(status)), ("x-meshfront-body", text)


@dataclasses.dataclass(frozen=True)
class ErrorShape:
    """How the caller hears an error before the first byte.

    ``body`` (and ``status``) set: an HTTP front end; the trailers carry the status and body for Envoy.
    Neither: a native gRPC front end (KServe), which gets the status with ErrorInfo details alone.
    """

    body: Callable[[MeshError], bytes] | None = None
    status: Callable[[MeshError], int] = lambda err: err.http_status
    retry_after: Callable[[MeshError], bool] = lambda err: False
    # How its callers present API keys and read their rate limits (--auth).
    api: auth.Api = auth.OPENAI_API

    async def abort(self, context: grpc.aio.ServicerContext | None, err: MeshError,
                    door: auth.Admission = auth.NO_KEY) -> NoReturn:
        """Ends the call with ``err``; without a context (one request of a KServe stream) raises it.
        ``door``: the request's admission (a 429's headers, and a limited key's, go with the error too)."""
        if context is None:
            raise err
        code, message, trailers = to_status(err)
        metadata: tuple[tuple[str, str | bytes], ...] = trailers
        if self.body is not None:
            metadata += http_trailers(self.status(err), self.body(err)) + auth.error_headers(err, self.api, door)
            if self.retry_after(err) and not isinstance(err, auth.RateLimited):
                metadata += (("x-meshfront-retry-after", "1"),)
        await context.abort(code, message, trailing_metadata=metadata)
        raise AssertionError("unreachable: abort raises")


OPENAI = ErrorShape(body=openai_errors.error_body, retry_after=lambda err: isinstance(err, Overloaded))
GRPC = ErrorShape(api=auth.GRPC_API)


async def abort_http(context: grpc.aio.ServicerContext, err: MeshError) -> NoReturn:
    """Aborts with OpenAI's error shape (every HTTP route but /v1/messages)."""
    await OPENAI.abort(context, err)


def unexpected(what: str, request_id: str) -> Internal:
    """A bug: logged with its traceback, answered as a 500 that names nothing internal."""
    log.exception("%s failed on request %s", what, request_id)
    return Internal("internal error in the gateway")


def as_mesh_error(e: Exception, what: str, request_id: str) -> MeshError:
    """What the caller hears of ``e``: a domain error as it is, anything else as a bug (``unexpected``)."""
    return e if isinstance(e, MeshError) else unexpected(what, request_id)


def new_request(endpoint: str) -> str:
    """A request's id, named on its trace with its endpoint."""
    request_id = uuid.uuid4().hex
    if tracing.ENABLED:
        tracing.set_attributes({tracing.MESH_REQUEST_ID_ATTRIBUTE: request_id, "meshfront.endpoint": endpoint})
    return request_id


class Renderer(Protocol):
    """One request's reply in a front end's wire shape: ``fold`` then ``body``, or ``sse`` per batch then
    ``sse_end``; ``sse_error`` is the in-band failure after the first byte. The token counts feed the
    request's metrics; ``usage`` is the API's own usage object."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    def fold(self, deltas: list[Delta]) -> None: ...

    def body(self) -> Any: ...

    def sse(self, deltas: list[Delta]) -> Any: ...

    def sse_end(self) -> Any: ...

    def sse_error(self, err: MeshError) -> Any: ...

    def usage(self) -> Any: ...


class Extras(Protocol):
    """What a request's extensions add around the reply (openai/extensions.py)."""

    def headers(self) -> Sequence[tuple[str, str]]: ...

    def annotation_events(self) -> bytes: ...


@dataclasses.dataclass
class Generation:
    """A started request: what ``start`` returns once the request is parsed, checked and running."""

    model: str
    streaming: bool
    renderer: Renderer
    stream: AsyncIterator[list[Delta]]
    extras: Extras | None = None
    # Runs after the last delta, before the body or the end goes out (the Responses API's store).
    on_complete: Callable[[], Awaitable[None]] | None = None


@dataclasses.dataclass(frozen=True)
class Framing:
    """Wraps a renderer's output as the RPC's message: HttpBody for HTTP, as it is for KServe."""

    body: Callable[[Any], Any]
    frame: Callable[[Any], Any]


HTTP = Framing(body=lambda data: httpbody_pb2.HttpBody(content_type=JSON, data=data),
               frame=lambda data: httpbody_pb2.HttpBody(content_type=SSE, data=data))
AS_IS = Framing(body=lambda out: out, frame=lambda out: out)


async def send_headers(context: grpc.aio.ServicerContext | None, extra: Sequence[tuple[str, str]]) -> None:
    """Response headers (a request's extensions', its key's limits; Envoy passes them on), with the first bytes."""
    if context is not None and extra:
        await context.send_initial_metadata(tuple(extra))


async def admitted(context: grpc.aio.ServicerContext | None, endpoint: str, shape: ErrorShape, *, metered: bool,
                   call_headers: Mapping[str, str] | None = None) -> auth.Admission:
    """The request's admission once its key (and, ``metered``, its quotas) let it in (``auth.admit``).
    ``call_headers``: the call's headers where ``context`` is None (one request of a KServe stream)."""
    sent = call_headers if call_headers is not None else headers(context) if context is not None else {}
    door = await auth.admit(endpoint, lambda: sent, shape.api, metered=metered)
    scheduling.place(door.record, sent)  # its policy class and tenant in the router's queue (scheduling.py)
    return door


async def key_checked(context: grpc.aio.ServicerContext, endpoint: str, shape: ErrorShape) -> auth.Admission:
    """The key check alone, for a call that describes what the mesh serves (the model list, KServe's metadata):
    no quota spent, no request counted; a missing or unknown key ends the call in ``shape``."""
    try:
        return await admitted(context, endpoint, shape, metered=False)
    except MeshError as err:
        await shape.abort(context, err)


Start = Callable[[Any, Any, Any, str], Awaitable[Generation]]


async def _begin(servicer: Any, start: Start, request: Any, context: grpc.aio.ServicerContext | None,
                 request_id: str, track: RequestTracker, perf: StagePerf | None,
                 door: auth.Admission) -> tuple[Generation, Any]:
    """Everything before the first byte: start the request, then fold it into its body (not streamed)
    or wait for its first batch (streamed); returns the generation and that body or batch."""
    if perf is None:
        gen = await start(servicer, request, context, request_id)
    else:  # --dyn-debug-perf: the front end's start (parse, check, stage requests) and every render, timed
        with perf.section("parse"):
            gen = await start(servicer, request, context, request_id)
        gen.renderer = TimedRenderer(gen.renderer, perf)
    door.check_model(gen.model)  # before the first batch: the pipeline has not run yet
    track.start(gen.model, gen.streaming)
    if gen.streaming:
        out = await anext(gen.stream, None)
        door.progress(gen.renderer.prompt_tokens, gen.renderer.completion_tokens)
    else:
        async for batch in gen.stream:
            gen.renderer.fold(batch)
        if gen.on_complete is not None:
            await gen.on_complete()
        out = gen.renderer.body()
    await send_headers(context, (*(gen.extras.headers() if gen.extras is not None else ()), *door.headers()))
    return gen, out


async def serve_generation(servicer: Any, start: Start, endpoint: str, shape: ErrorShape, request: Any,
                           context: grpc.aio.ServicerContext | None, framing: Framing = HTTP, *,
                           call_headers: Mapping[str, str] | None = None) -> AsyncIterator[Any]:
    """One generation request from start to end; yields the RPC's messages.

    ``start(servicer, request, context, request_id)`` parses, checks and starts the request; ``endpoint``
    names it in the metrics. ``context`` None: the caller is one request of a multiplexed stream
    (KServe's ModelStreamInfer), so an early error is raised to it instead of ending the call, and
    ``call_headers`` are the stream's headers (its key).
    """
    request_id = new_request(endpoint)
    door = auth.NO_KEY
    gen: Generation | None = None
    with RequestTracker(endpoint) as track, debug_perf.logged("gateway", request_id) as perf:
        err: MeshError
        try:
            try:
                door = await admitted(context, endpoint, shape, metered=True, call_headers=call_headers)
                gen, out = await _begin(servicer, start, request, context, request_id, track, perf, door)
            except Exception as e:  # noqa: BLE001 - a bug still gets the caller's error shape, and is logged
                err = as_mesh_error(e, endpoint, request_id)
                track.fail(err)
                await shape.abort(context, err, door)
            renderer = gen.renderer
            if not gen.streaming:
                track.finish(renderer.prompt_tokens, renderer.completion_tokens, renderer.cached_tokens)
                yield framing.body(out)
                return
            # Streamed: the first batch goes out with the response headers, then a frame per batch, then the end.
            try:
                if out is not None:
                    track.first_token()
                    lead = gen.extras.annotation_events() if gen.extras is not None else b""
                    data = renderer.sse(out)
                    yield framing.frame(lead + data if lead else data)
                async for batch in gen.stream:
                    data = renderer.sse(batch)
                    door.progress(renderer.prompt_tokens, renderer.completion_tokens)
                    if data:
                        yield framing.frame(data)
                if gen.on_complete is not None:
                    await gen.on_complete()
                track.finish(renderer.prompt_tokens, renderer.completion_tokens, renderer.cached_tokens)
                data = renderer.sse_end()
                if data:
                    yield framing.frame(data)
                return
            except MeshError as e:
                err = e
            except Exception:  # noqa: BLE001 - reported in-band like any other failure
                err = unexpected(f"{endpoint} stream", request_id)
            track.fail(err, mid_stream=True)
            log.warning("request %s failed mid-stream: %s", request_id, err.message)
            yield framing.frame(renderer.sse_error(err))
        finally:  # however it ends (the client gone included): the key's slot back, the rest of its tokens charged
            door.close(*(gen.renderer.prompt_tokens, gen.renderer.completion_tokens) if gen else ())


def generation_rpc(start: Start, endpoint: str, shape: ErrorShape = OPENAI) -> Any:
    """A servicer's RPC method (in its class body) that serves a generation request with ``start``.

    The method is ``serve_generation`` itself with the front end's arguments bound, not a wrapper
    re-yielding its messages: one generator per call, and it stays an async generator function, which
    the error interceptor drives with ``context.write``.
    """
    return functools.partialmethod(serve_generation, start, endpoint, shape)


@dataclasses.dataclass(frozen=True)
class Reply:
    """A unary request's answer: the RPC's message, and the token counts its metrics record."""

    message: Any
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


# Called by an ``Answer`` once the request is checked and about to run, with its model (for the metrics, and the
# 404 of a model outside the caller's key's --models).
Started = Callable[[str], None]
# (servicer, request, context, request_id, started) -> the reply: parses, checks, calls ``started``, runs.
Answer = Callable[[Any, Any, Any, str, Started], Awaitable[Reply]]


async def serve_unary(servicer: Any, answer: Answer, endpoint: str, shape: ErrorShape, counted: bool,
                      request: Any, context: grpc.aio.ServicerContext | None, *, metered: bool | None = None,
                      call_headers: Mapping[str, str] | None = None) -> Any:
    """One unary request from start to end; returns the RPC's message. Any failure aborts the call in
    ``shape`` (``context`` None: raised, as for one request of a KServe stream, whose headers are
    ``call_headers``). ``metered``: spends the key's quotas (default: as ``counted``; an extension route is
    counted but generates nothing)."""
    request_id = new_request(endpoint)
    door = auth.NO_KEY

    def started(model: str) -> None:
        door.check_model(model)
        track.start(model, False)
    with tracker(endpoint, counted) as track:
        try:
            door = await admitted(context, endpoint, shape, metered=counted if metered is None else metered,
                                  call_headers=call_headers)
            reply = await answer(servicer, request, context, request_id, started)
            await send_headers(context, door.headers())
        except Exception as e:  # noqa: BLE001 - a bug still gets the caller's error shape, and is logged
            err = as_mesh_error(e, endpoint, request_id)
            track.fail(err)
            door.close()
            await shape.abort(context, err, door)
        track.finish(reply.prompt_tokens, reply.completion_tokens, reply.cached_tokens)
        door.close(reply.prompt_tokens, reply.completion_tokens)
        return reply.message


def unary_rpc(answer: Answer, endpoint: str, shape: ErrorShape = OPENAI, *, counted: bool = True) -> Any:
    """A servicer's unary RPC method (in its class body) that answers with ``answer``; ``counted`` False:
    a request the metrics do not count (``endpoint`` then names it in the log alone)."""
    return functools.partialmethod(serve_unary, answer, endpoint, shape, counted)
