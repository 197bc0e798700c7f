"""The postprocessor as a transport-free service: proto in, proto stream out.

``Postprocessor.generate`` opens the worker calls, whose messages queue up as they arrive (the
multiplexed call's own inbox), and turns every group of worker messages that is ready into at most
one response, as the flush rule lets them out (aggregated.py, ``FlushRule``). The gRPC server wraps
it; the gateway can also call it in-process (then it must ``aclose()`` the generator when it stops
early, which cancels the worker calls).

A request runs as a loop of attempts (attempt.py), one per route, each of the kind its route asks for:
aggregated (aggregated.py), or a prefill leg and a decode leg in the sequential order (disagg_legs.py) or
the paired one (disagg_paired.py). Every attempt feeds the request's one ``ResponseBuilder``
(response_builder.py). Worker failures surface as ``WorkerFailed``; unless migration is off, the request
then moves to another worker (``migration.Migration``): the prompt plus the ids the decoder kept, budgets
reduced, as the next attempt, so the caller sees one uninterrupted stream.

Every response names the worker token ids it accounts for (``token_ids``). When a replica of this
service dies mid-stream, the gateway starts the request on another one with those ids as
``resume``: ``ResponseBuilder.replay`` runs them through a fresh decoder and parsers with their
output dropped (all of it is deterministic, so the state equals the dead replica's after its last
response), and the sequence continues on its worker as after a migration, emitting only new output.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator
from typing import Any

from meshfront.common.v1 import common_pb2
from meshfront.postprocessor.v1 import postprocessor_pb2

from services.common import debug_perf, tracing
from services.common.discovery import ModelCard
from services.common.errors import Internal, InvalidRequest, MeshError, StageUnavailable, WorkerFailed
from services.common.model_files import ModelFilesResolver, ModelFilesUnavailable
from services.postprocessor import convert
from services.postprocessor.aggregated import AggregatedAttempt, CallReader
from services.postprocessor.attempt import Attempt, WorkerClient
from services.postprocessor.core.parsers.backends import (
    ChatProcessor,
    OursChatProcessor,
    ParseContext,
    StreamingOutputParser,
)
from services.postprocessor.core.parsers.output import SingleToolCall
from services.postprocessor.core.sequence import SequenceDecoder
from services.postprocessor.core.tokenizers_cache import ModelTokenizer, TokenizerCache, TokenizerLoadError
from services.postprocessor.disagg_common import first_batch
from services.postprocessor.disagg_legs import KvReleaser, SequentialLegs, prefill_leg
from services.postprocessor.disagg_paired import PairedLegs, announces_pairing
from services.postprocessor.idle_watch import IdleWatch
from services.postprocessor.metrics import postprocessor_metrics
from services.postprocessor.migration import Migration, Migrator, WorkerRoute, continuation, guided
from services.postprocessor.response_builder import ResponseBuilder
from services.postprocessor.timed_builder import TimedResponseBuilder, timed_builder

log = logging.getLogger(__name__)

DEFAULT_IDLE_TIMEOUT_S = 5.0


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
                 model_files: ModelFilesResolver | None = None, auto_tool_choice: bool = False):
        self._owned_client = None
        # --enable-auto-tool-choice: tool calls are parsed without tools in the request too.
        self._auto_tool_choice = auto_tool_choice
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
        builder = await self._builder(req)
        reader = CallReader(builder, req.options.stream_interval, self._idle)
        route = WorkerRoute(req.worker_id, req.worker_address, req.prefill_worker_id, req.prefill_worker_address,
                            dp_rank=req.request.dp_rank if req.request.HasField("dp_rank") else None,
                            prefill_dp_rank=req.prefill_dp_rank if req.HasField("prefill_dp_rank") else None)
        span = _start_span(req)
        request = _resume(req, builder) if req.HasField("resume") else req.request
        migration = Migration(self.migrator, req.request)
        metrics = postprocessor_metrics()
        metrics.in_flight.inc()
        outcome = "cancelled"  # unless it finishes or fails: the caller went away
        try:
            while True:  # one attempt per route; after a failed one, the next runs where migration.move says
                attempt = await self._open_attempt(route, request, reader)
                responses = attempt.responses()
                try:
                    first = await anext(responses, None)
                    if first is not None:
                        migration.first_response(first)
                        yield first
                        async for response in responses:  # the token path: each response handed on as it is
                            yield response
                    outcome = "finished"
                    return
                except MeshError as e:
                    outcome = "failed"  # unless it moves on
                    route, request = await migration.move(e, attempt.blamed, builder.decoder.generated_ids)
                    outcome = "cancelled"
                finally:
                    await responses.aclose()  # cancels the worker call now, not when the generator is collected
        finally:
            metrics.in_flight.dec()
            metrics.streams.labels(outcome).inc()
            if isinstance(builder, TimedResponseBuilder):  # --dyn-debug-perf
                builder.perf.log()
            if span is not None:
                span.set_attributes({"meshfront.outcome": outcome, "meshfront.migrations": len(migration.failed)})
                tracing.end_span(span)

    async def _builder(self, req: postprocessor_pb2.GenerateRequest) -> ResponseBuilder:
        """The request's decoder and output parsers, over its model's tokenizer."""
        model_dir = await self._model_dir(req.options.model_dir, req.options.model_files)
        model = await self._tokenizer(model_dir)
        decoder = SequenceDecoder(model.tokenizer, convert.sequence_options(req.request))
        texts = model.texts if req.request.output.HasField("logprobs") else None
        make = timed_builder(req.request.request_id) if debug_perf.ENABLED else ResponseBuilder
        return make(decoder, texts,
                    output_parser(req.options, self._chat_processor, req.request, model_dir=model_dir,
                                  auto_tool_choice=self._auto_tool_choice))

    async def _open_attempt(self, route: WorkerRoute, request: common_pb2.PreprocessedRequest,
                            reader: CallReader) -> Attempt:
        """The attempt on ``route``, of the one kind it asks for. Without a prefill worker: aggregated. With one,
        the prefill leg opens here, and its first chunk says the order of the legs: paired when it announces
        the pairing (SGLang), sequential otherwise (vLLM, the mocker). A guided request runs aggregated on the
        decode worker even so: its grammar state, like a migration's, cannot pass from one worker to another."""
        if not route.prefill_address or guided(request):
            return AggregatedAttempt(route, request, self._workers, reader)
        call = self._workers.generate(route.prefill_address, prefill_leg(request, route))
        first = await first_batch(call)
        if first.messages and announces_pairing(first.messages[0]):
            return PairedLegs(route, request, call, first.messages, self._workers, reader)
        return SequentialLegs(route, request, call, first, self._workers, reader, self._kv_releaser)

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


def _start_span(req: postprocessor_pb2.GenerateRequest) -> Any:
    """The request's span (None while tracing is off); the workers' spans (every leg and attempt) nest under it."""
    if not tracing.ENABLED:
        return None
    span = tracing.start_span("postprocess", req.request.traceparent, {
        "meshfront.mesh_request_id": req.request.request_id})
    req.request.traceparent = tracing.traceparent_of(span)
    return span


def _resume(req: postprocessor_pb2.GenerateRequest, builder: ResponseBuilder) -> common_pb2.PreprocessedRequest:
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
                  model_dir: str | None = None, auto_tool_choice: bool = False) -> StreamingOutputParser | None:
    """The request's reasoning / tool-call parsers; None (no parsing at all) for plain requests.
    ``auto_tool_choice`` (--enable-auto-tool-choice): the model's tool calls are parsed without tools too."""
    if not (options.reasoning_parser or options.tools_json or (auto_tool_choice and options.tool_call_parser)):
        return None
    config = convert.parser_config(options, auto_tool_choice)
    prompt_ids = request.token_ids if request is not None else ()  # not copied: ours never read it
    # model_dir: the directory on this host (fetched model files), where the engines' parsers find the tokenizer.
    context = ParseContext(options.model_dir if model_dir is None else model_dir, options.tools_json, prompt_ids)
    try:
        parser = (chat_processor or OursChatProcessor()).output_parser(config, context)
    except LookupError as e:
        raise Internal(str(e)) from None
    return SingleToolCall(parser) if options.single_tool_call else parser
