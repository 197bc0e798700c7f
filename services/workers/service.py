"""The worker as a transport-free service: GenerateRequest in, GenerateResponse stream out.

One engine output becomes one response. Engines hand over every token that is ready when asked
(``TokenStream``), so while the transport is busy writing one message the next one fills up: a
slow reader gets fewer, fuller messages instead of a backlog of one-token messages.

Callers must ``aclose()`` the generator when they stop early (the gRPC glue does, so does an
in-process caller); that aborts the sequence and frees its KV blocks.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import AsyncGenerator

from meshfront.common.v1 import common_pb2
from meshfront.worker.v1 import worker_pb2

from services.common import tracing
from services.common.discovery import LoraAdapter
from services.common.errors import InvalidRequest
from services.workers import convert
from services.workers.engine import Engine, EngineBusy, EngineError, EngineOutput, FinishReason, RequestRejected
from services.workers.lora import LoraSettings, WorkerAdapters
from services.workers.metrics import worker_metrics

log = logging.getLogger(__name__)


class WorkerService:
    """Serves one engine. Engine errors leave as ``MeshError``s; anything else is a bug and propagates."""

    def __init__(self, engine: Engine, input_modalities: tuple[str, ...] = (),
                 adapters: WorkerAdapters | None = None):
        self.engine = engine
        self.input_modalities = input_modalities
        # LoRA off unless the kind passes its adapters: requests naming one are then a 404.
        self.adapters = adapters or WorkerAdapters(LoraSettings(), None)

    async def generate(self, request: worker_pb2.GenerateRequest) -> AsyncGenerator[worker_pb2.GenerateResponse, None]:
        for item in request.request.media:
            # The preprocessor only sends media to models whose cards declare it; a caller that
            # reached this worker directly still gets a clear refusal rather than a text-only answer.
            if item.modality not in self.input_modalities:
                raise InvalidRequest(f"this worker does not accept {item.modality} input", param="messages")
        engine_request = convert.request_from_proto(request)
        lora = request.request.lora if request.request.HasField("lora") else None
        if lora is not None:  # held, or loaded now (runtime loading), or a 404 naming the adapter
            held = await self.adapters.resolve(LoraAdapter(lora.name, lora.path))
            engine_request = dataclasses.replace(engine_request, lora=held)
        outputs = self.engine.generate(engine_request)
        sent, finished, outcome = 0, False, "aborted"
        # Traced: the request's arrival and first output; its spans are recorded once it ends (request_spans).
        received_ns = time.time_ns() if tracing.ENABLED else 0
        first: tuple[int, EngineOutput] | None = None
        metrics = worker_metrics()
        metrics.in_flight.inc()
        try:
            async for output in outputs:
                if output.prompt_tokens is not None:  # the first output
                    metrics.prompt_tokens.inc(output.prompt_tokens)
                    metrics.cached_prompt_tokens.inc(output.cached_tokens or 0)
                    if received_ns:
                        first = (time.time_ns(), output)
                sent += len(output.token_ids)
                finished = output.finish_reason != FinishReason.NONE
                if finished:
                    # Counted before the last yield: a caller that closes the stream as soon as it holds
                    # the final chunk ends this generator at that yield.
                    outcome = "finished"
                yield convert.output_to_proto(output)
            outcome = "finished"
        except EngineError as e:
            finished = True
            outcome = "rejected" if isinstance(e, (RequestRejected, EngineBusy)) else "failed"
            raise convert.engine_error(e) from e
        finally:
            await outputs.aclose()
            metrics.in_flight.dec()
            metrics.output_tokens.inc(sent)
            metrics.requests.labels(outcome).inc()
            if received_ns:
                request_spans(request.request, received_ns, first, sent, outcome)
            if not finished:
                # Operators (and the disconnect tests) see that a caller's cancel reached the engine.
                log.info("request %s aborted by the caller after %d tokens", request.request.request_id, sent)


def request_spans(request: common_pb2.PreprocessedRequest, received_ns: int, first: tuple[int, EngineOutput] | None,
                  sent: int, outcome: str) -> None:
    """The worker's part of the request's trace, recorded when it ended: the queue wait (when the engine said
    when it scheduled the sequence), the prefill, the first token (an instant) and the decode."""
    end_ns = time.time_ns()
    role = request.disaggregation.role
    span = tracing.start_span("worker", request.traceparent, {
        "meshfront.mesh_request_id": request.request_id, "meshfront.output_tokens": sent,
        "meshfront.outcome": outcome, "meshfront.disaggregation_role": _ROLES.get(role, str(role))},
        start_ns=received_ns)
    if first is not None:
        first_ns, output = first
        prefill_ns = output.scheduled_ns or received_ns
        if output.scheduled_ns:
            tracing.record_span("worker.queue_wait", span, received_ns, prefill_ns)
        tracing.record_span("worker.prefill", span, prefill_ns, first_ns, {
            "meshfront.prompt_tokens": output.prompt_tokens or 0, "meshfront.cached_tokens": output.cached_tokens or 0})
        tracing.record_span("worker.first_token", span, first_ns, first_ns)
        tracing.record_span("worker.decode", span, first_ns, end_ns, {"meshfront.output_tokens": sent})
    tracing.end_span(span, end_ns=end_ns)


_ROLES = {common_pb2.DISAGGREGATION_ROLE_UNSPECIFIED: "aggregated", common_pb2.DISAGGREGATION_ROLE_PREFILL: "prefill",
          common_pb2.DISAGGREGATION_ROLE_DECODE: "decode"}
