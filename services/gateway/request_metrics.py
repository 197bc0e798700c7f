"""One OpenAI request's metrics: counted when it starts, observed once when it ends.

Nothing here runs per token or per SSE frame except ``first_token`` (a timestamp, once). The mean
inter-token latency is derived at the end from the first-token time, the end time and the output
token count, so a 1,000-token stream costs the same handful of metric updates as a 1-token one.
"""

from __future__ import annotations

import time

from services.common.errors import MeshError
from services.common.metrics import gateway_metrics


class RequestTracker:
    """Tracks one request from arrival; ``close`` must run exactly once (it does in a ``finally``)."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self._metrics = gateway_metrics()
        self._arrived = time.monotonic()
        self._first: float | None = None
        self._model = ""
        self._stream = False
        self._status: str | None = None
        self._started = False

    def start(self, model: str, stream: bool) -> None:
        """The request was valid and is about to run."""
        self._model, self._stream, self._started = model, stream, True
        self._metrics.in_flight.labels(model).inc()

    def first_token(self) -> None:
        if self._first is None:
            self._first = time.monotonic()
            self._metrics.ttft.labels(self._model).observe(self._first - self._arrived)

    def finish(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> None:
        """The request completed: its token counts and, for streams, its mean inter-token gap."""
        m, model = self._metrics, self._model
        self._status = "200"
        m.input_tokens.labels(model).inc(prompt_tokens)
        m.output_tokens.labels(model).inc(completion_tokens)
        if cached_tokens:
            m.cached_tokens.labels(model).inc(cached_tokens)
        if self._first is not None and completion_tokens > 1:
            m.itl.labels(model).observe((time.monotonic() - self._first) / (completion_tokens - 1))

    def fail(self, err: MeshError, *, mid_stream: bool = False) -> None:
        """The request failed; a mid-stream failure keeps the 200 the client already got."""
        self._status = "200" if mid_stream else str(err.http_status)
        self._metrics.errors.labels(self._model, err.reason).inc()

    def close(self) -> None:
        """Ends the request; one that neither finished nor failed was cancelled (client gone)."""
        m, model = self._metrics, self._model
        if self._status is None:
            self._status = "499"
            m.errors.labels(model, "CANCELLED").inc()
        if self._started:
            m.in_flight.labels(model).dec()
            m.duration.labels(model, self.endpoint).observe(time.monotonic() - self._arrived)
        m.requests.labels(model, self.endpoint, "true" if self._stream else "false", self._status).inc()
