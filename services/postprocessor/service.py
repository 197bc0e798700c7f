"""The postprocessor as a transport-free service: proto in, proto stream out.

``Postprocessor.generate`` opens the worker call, whose messages queue up as they arrive (the
multiplexed call's own inbox), and turns
every group of worker messages that is ready into at most one response. The gRPC server wraps
it; the gateway can also call it in-process (then it must ``aclose()`` the generator when it stops
early, which cancels the worker call).

Worker failures surface as ``WorkerFailed``. Unless migration is off, ``generate`` then moves the
request to another worker (``migration.Migrator``): the prompt plus the ids the decoder kept,
budgets reduced, fed into the same decoder, so the caller sees one uninterrupted stream.

Every response names the worker token ids it accounts for (``token_ids``). When a replica of this
service dies mid-stream, the gateway starts the request on another one with those ids as
``resume``: ``_ResponseBuilder.replay`` runs them through a fresh decoder and parsers with their
output dropped (all of it is deterministic, so the state equals the dead replica's after its last
response), and the sequence continues on its worker as after a migration, emitting only new output.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator
from typing import Protocol

from meshfront.common.v1 import common_pb2
from meshfront.postprocessor.v1 import postprocessor_pb2
from meshfront.worker.v1 import worker_pb2

from services.common import tracing
from services.common.discovery import ModelCard
from services.common.errors import Internal, InvalidRequest, MeshError, StageUnavailable, WorkerFailed
from services.common.model_files import ModelFilesResolver, ModelFilesUnavailable
from services.common.pump import Batch
from services.postprocessor import convert
from services.postprocessor.core.logprobs import TokenTexts
from services.postprocessor.core.parsers.backends import (
    ChatProcessor,
    OursChatProcessor,
    ParseContext,
    StreamingOutputParser,
)
from services.postprocessor.core.parsers.output import SingleToolCall
from services.postprocessor.core.parsers.types import concat
from services.postprocessor.core.sequence import Delta, FinishReason, SequenceDecoder
from services.postprocessor.core.tokenizers_cache import ModelTokenizer, TokenizerCache, TokenizerLoadError
from services.postprocessor.disagg_legs import DisaggLegs, KvReleaser
from services.postprocessor.idle_watch import IdleWatch
from services.postprocessor.metrics import postprocessor_metrics
from services.postprocessor.migration import Migrator, WorkerRoute, continuation, guided

log = logging.getLogger(__name__)

DEFAULT_IDLE_TIMEOUT_S = 5.0


class WorkerCall(Protocol):
    """One running sequence on a worker."""

    async def next_batch(self) -> Batch[worker_pb2.GenerateResponse]:
        """Every message that arrived since the last call (at least one), and whether the stream then
        ended cleanly or failed (``error``, a ``MeshError`` for a worker failure)."""

    def cancel(self) -> None:
        """Aborts the call (the worker stops generating); safe once it has ended."""

    def fail(self, error: MeshError) -> None:
        """Ends the call with ``error`` as its next outcome (the idle watch's verdict on a silent worker)."""


class WorkerClient(Protocol):
    """Opens Generate calls on workers by address."""

    def generate(self, address: str, request: worker_pb2.GenerateRequest) -> WorkerCall: ...


class _ResponseBuilder:
    """Per-request state between worker messages and responses.

    Tokens (and their logprobs) whose text is still held back are carried over to the next response
    rather than sent in an empty one; only the first response (usage fields) and the last (finish
    reason) go out without text.
    """

    def __init__(self, decoder: SequenceDecoder, texts: TokenTexts | None,
                 parser: StreamingOutputParser | None = None):
        self.decoder = decoder
        self._texts = texts
        self._parser = parser  # None: the text is plain content (no tools, no reasoning parser)
        self._first = True
        self._tokens = 0
        self._reported = 0  # decoder.generated_ids[:_reported] were named in responses already
        self._logprobs: list[common_pb2.TokenLogprob] = []

    @property
    def first(self) -> bool:
        """No response was built yet (the first one carries the usage fields and goes at once)."""
        return self._first

    def replay(self, ids: list[int]) -> None:
        """Takes in ids whose output another replica already sent (``GenerateRequest.resume``): the decoder,
        stop-string hold-back and parsers end up as they were there after its last response, and the next
        response carries only what follows."""
        delta = self.decoder.step(ids)
        if self.decoder.finish is not None or delta.tokens != len(ids):
            # The replica that sent them would have finished the sequence with them: they are not its output.
            raise InvalidRequest("resume.token_ids end the sequence", param="resume.token_ids")
        if self._parser is not None and ids:
            self._parser.feed(delta.text, ids)
        self._first = False  # the usage fields of the first response went out already
        self._reported = len(self.decoder.generated_ids)

    def build(self, messages: list[worker_pb2.GenerateResponse]) -> postprocessor_pb2.GenerateResponse | None:
        ids: list[int] = []
        logprobs: list[common_pb2.TokenLogprob] = []
        worker_finish = 0
        for message in messages:
            ids.extend(message.token_ids)
            if self._texts is not None:
                logprobs.extend(message.logprobs)
            worker_finish = message.finish_reason or worker_finish
        delta = self.decoder.step(ids, convert.finish_from_proto(worker_finish))
        self._tokens += delta.tokens
        if self._texts is not None:
            self._logprobs.extend(logprobs[:delta.tokens])
        if self._parser is not None:
            return self._parsed(delta, messages, ids[:delta.tokens])
        if not delta.text and delta.finish is None and not self._first:
            return None
        response = postprocessor_pb2.GenerateResponse(
            text=delta.text, completion_tokens=self._tokens, finish_reason=convert.finish_to_proto(delta.finish),
            stop_reason=delta.stop_reason or "")
        return self._complete(response, messages)

    def _parsed(self, delta: Delta, messages: list[worker_pb2.GenerateResponse],
                ids: list[int]) -> postprocessor_pb2.GenerateResponse | None:
        """The delta through the reasoning / tool-call parsers: text they hold back waits like held tokens."""
        parser = self._parser
        assert parser is not None
        parsed = parser.feed(delta.text, ids) if delta.text or ids else None  # engine backends need the ids
        if delta.finish is not None:
            parsed = concat(parsed, parser.finish())
        if not parsed and delta.finish is None and not self._first:
            return None
        finish = convert.finish_to_proto(delta.finish)
        if delta.finish in (FinishReason.EOS, FinishReason.STOP) and parser.ends_with_tool_calls:
            finish = common_pb2.FINISH_REASON_TOOL_CALLS
        response = postprocessor_pb2.GenerateResponse(completion_tokens=self._tokens, finish_reason=finish,
                                                      stop_reason=delta.stop_reason or "")
        if parsed:
            response.text, response.reasoning_text = parsed.content, parsed.reasoning
            response.tool_calls.extend(postprocessor_pb2.ToolCallDelta(index=c.index, id=c.id, name=c.name,
                                                                       arguments=c.arguments)
                                       for c in parsed.tool_calls)
        return self._complete(response, messages)

    def _complete(self, response: postprocessor_pb2.GenerateResponse,
                  messages: list[worker_pb2.GenerateResponse]) -> postprocessor_pb2.GenerateResponse:
        if self._first:
            self._first = False
            response.cached_tokens = messages[0].cached_tokens
            response.prompt_tokens = messages[0].prompt_tokens
        generated = self.decoder.generated_ids
        if len(generated) > self._reported:  # one extend per response: the ids the caller resumes from
            response.token_ids.extend(generated[self._reported:])
            self._reported = len(generated)
        if self._logprobs:
            response.logprobs.extend(convert.token_texts(self._logprobs, self._texts))  # type: ignore[arg-type]
            self._logprobs = []
        self._tokens = 0
        return response


class Postprocessor:
    """Detokenizes, applies stop conditions and coalesces the token stream of a worker.

    Args:
        workers: how to reach workers; by default a ``mux_client.MuxWorkerClient`` that this
            object owns (``close`` closes its channels).
        tokenizers: shared tokenizer cache; one is created if not given.
        migrator: moves requests off failed workers; None disables migration.
        chat_processor: whose parsers split output into content, reasoning and tool calls (default: ours).
        idle_timeout_s: once a worker has sent its first tokens, a silence this long means it is
            frozen (SIGSTOP, a wedged host: the connection stays open) and the stream fails over
            like a dead one. Decoding emits every few ms; only the prefill may legitimately take
            long, and it is not timed. 0 disables.
        kv_releaser: frees what a prefill worker holds for a decode leg that will not come (disagg_legs.py);
            by default a ``kv_release.GrpcKvReleaser`` this object owns.
    """

    def __init__(self, workers: WorkerClient | None = None, tokenizers: TokenizerCache | None = None,
                 migrator: Migrator | None = None, idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
                 chat_processor: ChatProcessor | None = None, kv_releaser: KvReleaser | None = None,
                 model_files: ModelFilesResolver | None = None):
        self._owned_client = None
        # Models' files from NATS (services/common/model_files.py); None: read the request's model_dir.
        self._files = model_files
        if workers is None:
            from services.postprocessor.mux_client import MuxWorkerClient  # keeps gRPC out of this module

            workers = self._owned_client = MuxWorkerClient()
        self._workers = workers
        # Disaggregated requests free what a prefill worker holds for a decode leg that will not come.
        self._owned_releaser = None
        if kv_releaser is None:
            from services.postprocessor.kv_release import GrpcKvReleaser

            kv_releaser = self._owned_releaser = GrpcKvReleaser()
        self._kv_releaser = kv_releaser
        self._tokenizers = tokenizers or TokenizerCache()
        self.migrator = migrator or Migrator(None, 0)
        self._idle = IdleWatch(idle_timeout_s) if idle_timeout_s else None
        self._chat_processor = chat_processor or OursChatProcessor()

    async def close(self) -> None:
        """Closes the worker channels this object opened (none when ``workers`` was given)."""
        if self._idle is not None:
            await self._idle.close()
        await self.migrator.close()
        if self._owned_client is not None:
            await self._owned_client.close()
        if self._owned_releaser is not None:
            await self._owned_releaser.close()

    async def generate(
            self, req: postprocessor_pb2.GenerateRequest) -> AsyncGenerator[postprocessor_pb2.GenerateResponse, None]:
        """Runs ``req`` on its worker and yields text deltas; the last one has a finish reason.

        Raises:
            InvalidRequest: no worker address or model directory.
            WorkerFailed: the worker could not be reached or its stream broke.
            Internal: the model's tokenizer cannot be loaded.
        """
        if not req.worker_address:
            raise InvalidRequest("worker_address is required", param="worker_address")
        model_dir = await self._model_dir(req.options.model_dir, req.options.model_files)
        model = await self._tokenizer(model_dir)
        decoder = SequenceDecoder(model.tokenizer, convert.sequence_options(req.request))
        texts = model.texts if req.request.output.HasField("logprobs") else None
        builder = _ResponseBuilder(decoder, texts,
                                   output_parser(req.options, self._chat_processor, req.request, model_dir=model_dir))
        route = WorkerRoute(req.worker_id, req.worker_address, req.prefill_worker_id, req.prefill_worker_address)
        span = tracing.start_span("postprocess", req.request.traceparent, {
            "meshfront.mesh_request_id": req.request.request_id}) if tracing.ENABLED else None
        if span is not None:  # the workers' spans (every leg and attempt) nest under this one
            req.request.traceparent = tracing.traceparent_of(span)
        request, failed = req.request, []
        if req.HasField("resume"):
            request = _resume(req, builder)
        moved_to = ""  # after a migration: the new worker, told to the caller with the next response
        answered = False  # a response went out: the caller has reported the request's first token
        report_first_token = False  # this (migrated) attempt's first token is for the router to hear of here
        metrics = postprocessor_metrics()
        metrics.in_flight.inc()
        outcome = "cancelled"  # unless it finishes or fails: the caller went away
        try:
            while True:
                legs = None
                # Disaggregated: a prefill leg, then a decode leg (disagg_legs.py). Not a guided request: its
                # grammar state, like a migration's, cannot pass from one worker to the other; its decode
                # worker runs it whole.
                if route.prefill_address and not guided(request):
                    legs = self._legs(req.options.stream_interval, builder)
                    attempt = legs.run(route, request, builder.build, lambda: decoder.generated_ids,
                                       lambda: decoder.finish is not None)
                else:
                    attempt = self._attempt(route.address, request, builder, req.options.stream_interval)
                try:
                    async for response in attempt:
                        if moved_to:
                            response.worker_id, moved_to = moved_to, ""
                        if report_first_token:
                            self.migrator.report_first_token(request.request_id)
                            report_first_token = False
                        answered = True
                        yield response
                    outcome = "finished"
                    return
                except MeshError as e:
                    metrics.worker_failures.labels(e.reason).inc()
                    failed.append(legs.blamed if legs is not None else route.worker_id)
                    outcome = "failed"
                    route = await self.migrator.next_route(req.request, failed, e, len(decoder.generated_ids))
                    moved_to = route.worker_id
                    # Before any response, the caller's own first-token report will be this attempt's.
                    report_first_token = answered and route.report_first_token
                    metrics.migrations.inc()
                    outcome = "cancelled"
                    request = continuation(req.request, decoder.generated_ids)
                finally:
                    await attempt.aclose()  # cancels the worker call now, not when the generator is collected
        finally:
            metrics.in_flight.dec()
            metrics.streams.labels(outcome).inc()
            if span is not None:
                span.set_attributes({"meshfront.outcome": outcome, "meshfront.migrations": len(failed)})
                tracing.end_span(span)

    def _legs(self, stream_interval: int, builder: _ResponseBuilder) -> DisaggLegs:
        return DisaggLegs(self._workers.generate,
                          lambda address, request, call: self._attempt(address, request, builder, stream_interval,
                                                                       call),
                          self._kv_releaser)

    async def _attempt(self, address: str, request: common_pb2.PreprocessedRequest, builder: _ResponseBuilder,
                       stream_interval: int = 1, call: WorkerCall | None = None,
                       ) -> AsyncGenerator[postprocessor_pb2.GenerateResponse, None]:
        """Runs ``request`` on one worker, feeding ``builder``; ends when the sequence finished. ``call``: one
        already opened for ``request`` (a decode leg's, started while its prefill leg's token went out).

        Worker messages are built into a response as they come, or, with a ``stream_interval`` above 1,
        once that many tokens are gathered (the first response, a finish and a failure never wait).
        """
        call = call or self._workers.generate(address, worker_pb2.GenerateRequest(request=request))
        held: list[worker_pb2.GenerateResponse] = []  # worker messages not yet built into a response
        held_tokens = 0  # their token count, kept as they come (summing them per batch was 10 % of a profile)
        watched = None  # the prefill is not timed: the watch starts with the first tokens
        try:
            while True:
                if watched is not None:
                    watched.waiting()
                batch = await call.next_batch()
                if watched is not None:
                    watched.got()
                elif self._idle is not None:
                    watched = self._idle.watch(address, call.fail)
                messages = batch.messages
                held.extend(messages)
                if stream_interval > 1:
                    held_tokens += sum(len(m.token_ids) for m in messages)
                if held and (stream_interval <= 1 or held_tokens >= stream_interval or builder.first
                             or batch.error is not None or batch.ended
                             or held[-1].finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED):
                    response = builder.build(held)
                    held, held_tokens = [], 0
                    if response is not None:
                        yield response
                    if builder.decoder.finish is not None:
                        return
                if batch.error is not None:
                    raise _as_worker_error(batch.error, address)
                if batch.ended:
                    raise WorkerFailed("worker ended the stream without a finish reason")
        finally:
            # Also runs when the caller cancels or closes us: the worker must stop generating at once.
            if watched is not None and self._idle is not None:
                self._idle.forget(watched)
            call.cancel()

    async def warm(self, card: ModelCard) -> None:
        """Loads a model's tokenizer ahead of its first request; a failure is logged, and the first
        request reports it."""
        with contextlib.suppress(Internal, StageUnavailable):
            await self._tokenizer(await self._model_dir(card.model_dir, card.model_files))

    async def _model_dir(self, model_dir: str, model_files: str) -> str:
        """Where the model's tokenizer is on this host: fetched from NATS once when the card published it."""
        if self._files is None or not model_files:
            return model_dir
        found = self._files.peek(model_dir, model_files)
        if found is not None:
            return found
        try:
            return await self._files.local_dir(model_dir, model_files)
        except ModelFilesUnavailable as e:
            log.error("%s", e)  # NATS or the worker's upload: both come back by themselves
            raise StageUnavailable("the model's files are not available yet") from None

    async def _tokenizer(self, model_dir: str) -> ModelTokenizer:
        cached = self._tokenizers.get(model_dir)
        if cached is not None:
            return cached
        if not model_dir:
            raise InvalidRequest("options.model_dir is required", param="options.model_dir")
        try:
            # Reading a 150k-vocabulary tokenizer.json takes ~1 s: keep it off the event loop.
            return await asyncio.to_thread(self._tokenizers.load, model_dir)
        except TokenizerLoadError as e:
            log.error("%s", e)
            raise Internal("the model's tokenizer cannot be loaded") from e


def _resume(req: postprocessor_pb2.GenerateRequest, builder: _ResponseBuilder) -> common_pb2.PreprocessedRequest:
    """Takes over a sequence another replica was running when it went away: replays what that one sent,
    and returns the request that continues it on the worker it ran on (whose KV cache holds the prompt,
    and whose booking at the router stands), as a migration would."""
    if req.resume.token_ids and guided(req.request):  # as migration refuses it, and for the same reason
        raise WorkerFailed("the postprocessor serving this request went away; guided decoding cannot resume")
    builder.replay(list(req.resume.token_ids))
    generated = builder.decoder.generated_ids
    postprocessor_metrics().resumes.inc()
    log.info("request %s resumes after %d tokens", req.request.request_id, len(generated))
    return continuation(req.request, generated)


def output_parser(options: common_pb2.PostprocessOptions, chat_processor: ChatProcessor | None = None,
                  request: common_pb2.PreprocessedRequest | None = None, *,
                  model_dir: str | None = None) -> StreamingOutputParser | None:
    """The request's reasoning / tool-call parsers; None (no parsing at all) for plain requests."""
    if not (options.reasoning_parser or options.tools_json):
        return None
    config = convert.parser_config(options)
    prompt_ids = request.token_ids if request is not None else ()  # not copied: ours never read it
    # model_dir: the directory on this host (fetched model files), where the engines' parsers find the tokenizer.
    context = ParseContext(options.model_dir if model_dir is None else model_dir, options.tools_json, prompt_ids)
    try:
        parser = (chat_processor or OursChatProcessor()).output_parser(config, context)
    except LookupError as e:
        raise Internal(str(e)) from None
    return SingleToolCall(parser) if options.single_tool_call else parser


def _as_worker_error(error: BaseException, address: str) -> MeshError:
    """Errors with a domain reason pass through; anything else means the worker failed."""
    if isinstance(error, MeshError):
        return error
    log.warning("worker %s stream failed: %r", address, error)
    return WorkerFailed("worker failed")
