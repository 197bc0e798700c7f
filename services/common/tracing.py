"""OpenTelemetry tracing for every Meshfront process: one trace per request, off unless asked for.

Tracing is on in a process when the standard ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_ENDPOINT`` names an OTLP/gRPC collector (``meshfront run --trace`` sets it for
every process it starts; Kubernetes manifests take it from the ``meshfront-tracing`` ConfigMap).
``configure`` reads it once at start. Off, ``ENABLED`` stays False and nothing here imports
OpenTelemetry's SDK: every helper below returns at its first line, and callers test ``ENABLED``
before building attributes, so the off path costs one global read per request and stage and
none per token.

The W3C ``traceparent`` travels in gRPC metadata on unary calls (``call_metadata``; the server side
attaches it with ``ContextInterceptor``) and in ``PreprocessedRequest.traceparent`` on the
multiplexed streams, where one call carries many requests and per-call metadata cannot tell them
apart. ``nats_headers`` / ``from_nats_headers`` do the same for NATS messages.

Long-lived spans (a stream's) are opened with ``start_span`` and ended explicitly, never made the
current context across a ``yield``: an async generator may be closed from another task, where a
context token cannot be detached. Spans whose times are only known afterwards (a worker's queue,
prefill and decode) are recorded at the end of the request with ``record_span``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
# The client's (or Envoy's) request id: the attribute ``meshfront trace REQUEST_ID`` looks for.
REQUEST_ID_ATTRIBUTE = "meshfront.request_id"
# The id the mesh's own calls carry (the gateway's, one per choice): ties a span to the stages' logs.
MESH_REQUEST_ID_ATTRIBUTE = "meshfront.mesh_request_id"
ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")

ENABLED = False
_tracer: Any = None
_provider: Any = None


def endpoint_from_env(env: Mapping[str, str] | None = None) -> str:
    """The OTLP endpoint the environment names, or "" (tracing off)."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return ""
    return next((env[v] for v in ENDPOINT_VARS if env.get(v)), "")


def configure(service: str, env: Mapping[str, str] | None = None, exporter: Any = None) -> bool:
    """Turns tracing on for this process when the environment names a collector; returns whether it did.

    ``service`` becomes the spans' ``service.name`` unless ``OTEL_SERVICE_NAME`` sets one. ``exporter`` (an
    OpenTelemetry ``SpanExporter``, for tests) replaces the OTLP one and turns tracing on by itself.
    """
    global ENABLED, _tracer, _provider
    env = os.environ if env is None else env
    endpoint = endpoint_from_env(env)
    if ENABLED or not (endpoint or exporter):
        return ENABLED
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    name = env.get("OTEL_SERVICE_NAME") or f"meshfront-{service}"
    # The process's own provider, not the global one: nothing else in the process traces through it.
    _provider = TracerProvider(resource=Resource.create({"service.name": name}))
    if exporter is not None:
        _provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        # Plaintext unless the endpoint says https: the collector is usually a sidecar or on loopback.
        _provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(
            endpoint=endpoint, insecure=not endpoint.startswith("https://"))))
    _tracer = _provider.get_tracer("meshfront")
    ENABLED = True
    log.info("tracing on: spans of %s go to %s", name, endpoint or exporter)
    return True


def shutdown() -> None:
    """Flushes the spans still batched (the SDK also does it at exit); for tests and clean stops."""
    global ENABLED, _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    ENABLED, _tracer, _provider = False, None, None


def _context(traceparent: str) -> Any:
    """The OpenTelemetry context a ``traceparent`` value continues; the current one when it is empty."""
    if not traceparent:
        return None  # the current context: in-process callers (the all-in-one) share the caller's
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    return TraceContextTextMapPropagator().extract({TRACEPARENT: traceparent})


def start_span(name: str, traceparent: str = "", attributes: Mapping[str, Any] | None = None,
               start_ns: int | None = None) -> Any:
    """An open span, child of ``traceparent`` (or of the current context when it is empty); None when off.

    The caller ends it with ``end_span``.
    """
    if not ENABLED:
        return None
    return _tracer.start_span(name, context=_context(traceparent), attributes=attributes, start_time=start_ns)


def end_span(span: Any, error: BaseException | None = None, end_ns: int | None = None) -> None:
    if span is None:
        return
    if error is not None:
        from opentelemetry.trace import Status, StatusCode
        span.set_status(Status(StatusCode.ERROR, type(error).__name__))
    span.end(end_time=end_ns)


def record_span(name: str, parent: Any, start_ns: int, end_ns: int,
                attributes: Mapping[str, Any] | None = None) -> None:
    """A finished span with known times under ``parent`` (an open span); nothing when off or no parent."""
    if parent is None:
        return
    from opentelemetry.trace import set_span_in_context
    child = _tracer.start_span(name, context=set_span_in_context(parent), attributes=attributes,
                               start_time=start_ns)
    child.end(end_time=end_ns)


def traceparent_of(span: Any) -> str:
    """The W3C ``traceparent`` naming ``span`` (for the next hop's message); "" for None."""
    if span is None:
        return ""
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"


def current_traceparent() -> str:
    """The current context's ``traceparent``; "" when off or outside any span."""
    if not ENABLED:
        return ""
    from opentelemetry import trace
    span = trace.get_current_span()
    return traceparent_of(span) if span.get_span_context().is_valid else ""


@contextlib.contextmanager
def current(span: Any) -> Iterator[None]:
    """Makes ``span`` the current context within this block (never across a ``yield``); no-op for None."""
    if span is None:
        yield
        return
    from opentelemetry import context as otel_context
    from opentelemetry.trace import set_span_in_context
    token = otel_context.attach(set_span_in_context(span))
    try:
        yield
    finally:
        otel_context.detach(token)


@contextlib.contextmanager
def span(name: str, attributes: Mapping[str, Any] | None = None) -> Iterator[Any]:
    """A span for a block without a ``yield`` in it, child of the current context; yields None when off."""
    if not ENABLED:
        yield None
        return
    with _tracer.start_as_current_span(name, attributes=attributes) as s:
        yield s


@contextlib.contextmanager
def server_span(name: str, traceparent: str, request_id: str, *, edge: bool) -> Iterator[Any]:
    """The span of one served call, current within the block (the error interceptor's, when on).

    ``edge``: the call came from Envoy, whose ``x-request-id`` is the client's (or one Envoy made up), the
    key ``meshfront trace`` finds the trace by; elsewhere it is the mesh's own request id.
    """
    from opentelemetry.trace import SpanKind
    attributes = {"rpc.method": name}
    if request_id:
        attributes[REQUEST_ID_ATTRIBUTE if edge else MESH_REQUEST_ID_ATTRIBUTE] = request_id
    s = _tracer.start_span(name, context=_context(traceparent), kind=SpanKind.SERVER, attributes=attributes)
    error: BaseException | None = None
    try:
        with current(s):
            yield s
    except BaseException as e:
        error = e
        raise
    finally:
        end_span(s, error)


def set_attributes(attributes: Mapping[str, Any]) -> None:
    """Adds ``attributes`` to the current span (the served call's); no-op when off or outside a span."""
    if not ENABLED:
        return
    from opentelemetry import trace
    trace.get_current_span().set_attributes(attributes)


def call_metadata(metadata: Sequence[tuple[str, str]] = ()) -> tuple[tuple[str, str], ...]:
    """``metadata`` plus the current context's ``traceparent`` for a unary gRPC call."""
    parent = current_traceparent()
    return (*metadata, (TRACEPARENT, parent)) if parent else tuple(metadata)


def from_metadata(metadata: Sequence[tuple[str, Any]] | None) -> str:
    """The ``traceparent`` of a call's invocation metadata, or ""."""
    for key, value in metadata or ():
        if key == TRACEPARENT and isinstance(value, str):
            return value
    return ""


def nats_headers(headers: dict[str, str] | None = None) -> dict[str, str] | None:
    """``headers`` with the current context's ``traceparent`` for a NATS publish (unchanged when off)."""
    parent = current_traceparent()
    if not parent:
        return headers
    return {**(headers or {}), TRACEPARENT: parent}


def from_nats_headers(headers: Mapping[str, str] | None) -> str:
    """The ``traceparent`` a NATS message carries, or ""."""
    return (headers or {}).get(TRACEPARENT, "")
