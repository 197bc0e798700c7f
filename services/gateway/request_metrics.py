"""One request's metrics: counted when it starts, recorded once when it ends.

Nothing here runs per token or per SSE frame except ``first_token`` (a timestamp, once). The mean
inter-token latency is derived at the end from the first-token time, the end time and the output
token count, so a 1,000-token stream costs the same handful of metric updates as a 1-token one.
Which families record it (ours or Dynamo's names) is the process's ``--metrics-prefix``
(frontend_metrics.py).
"""

from __future__ import annotations

import time

from services.common.errors import MeshError
from services.gateway.frontend_metrics import Outcome, recorder


class RequestTracker:
    """Tracks one request from arrival; used as a context manager, which closes it exactly once
    (``with RequestTracker("chat") as track: ...``)."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self._recorder = recorder()
        self._arrived = time.monotonic()
        self._first: float | None = None
        self._model = ""
        self._stream = False
        self._status: str | None = None
        self._reason = ""
        self._started = False
        self._tokens = (0, 0, 0)
        self._itl: float | None = None

    def __enter__(self) -> RequestTracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, model: str, stream: bool) -> None:
        """The request was valid and is about to run."""
        self._model, self._stream, self._started = model, stream, True
        self._recorder.started(model)

    def first_token(self) -> None:
        if self._first is None:
            self._first = time.monotonic()
            self._recorder.first_token(self._model, self._first - self._arrived)

    def finish(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> None:
        """The request completed: its token counts and, for streams, its mean inter-token gap."""
        self._status = "200"
        self._tokens = (prompt_tokens, completion_tokens, cached_tokens)
        if self._first is not None and completion_tokens > 1:
            self._itl = (time.monotonic() - self._first) / (completion_tokens - 1)

    def fail(self, err: MeshError, *, mid_stream: bool = False) -> None:
        """The request failed; a mid-stream failure keeps the 200 the client already got."""
        self._status = "200" if mid_stream else str(err.http_status)
        self._reason = err.reason

    def close(self) -> None:
        """Ends the request; one that neither finished nor failed was cancelled (client gone)."""
        if self._status is None:
            self._status, self._reason = "499", "CANCELLED"
        prompt, completion, cached = self._tokens
        self._recorder.ended(Outcome(
            model=self._model, endpoint=self.endpoint, stream=self._stream, status=self._status,
            reason=self._reason, started=self._started, duration_s=time.monotonic() - self._arrived,
            prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached, itl_s=self._itl,
            first_token=self._first is not None))


class Untracked:
    """A request the metrics do not count (a download, a token count): the same calls, nothing recorded."""

    def __enter__(self) -> Untracked:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def start(self, model: str, stream: bool) -> None:
        pass

    def first_token(self) -> None:
        pass

    def finish(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> None:
        pass

    def fail(self, err: MeshError, *, mid_stream: bool = False) -> None:
        pass


def tracker(endpoint: str, counted: bool) -> RequestTracker | Untracked:
    """``endpoint``'s tracker, or ``Untracked`` for a request the metrics do not count."""
    return RequestTracker(endpoint) if counted else Untracked()
