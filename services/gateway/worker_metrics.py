"""What this gateway sees of each worker through its own requests, for Dynamo's per-worker families.

Dynamo's frontend exports, per worker, the last request's time to first token, input length and
inter-token latency, the prefill tokens and decode blocks its requests hold, the requests waiting on
the router, and each model's migrations (dynamo-frontend.md §9). In this mesh the gateway is where a
request's whole life is seen: the pipeline (core/pipeline.py) opens a ``ChoiceLoad`` per routed choice
and tells it the first output, a move to another worker and the end; nothing runs per token.

Loads are this gateway's requests only: with several replicas, the edge's /metrics labels each
replica's series (``gateway=``) and ``sum by (worker_id)`` is the fleet's. A worker's series go when
its card leaves discovery: the collector (frontend_metrics.py) emits only workers that are registered.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import time
from collections.abc import Iterator

from services.common.dp_ranks import split_target

NEW_REQUEST, ONGOING_REQUEST = "new_request", "ongoing_request"  # Dynamo's migration_type values


@dataclasses.dataclass
class Last:
    """A worker's most recent observations (each None until first seen)."""

    ttft_s: float | None = None
    input_tokens: int | None = None
    itl_s: float | None = None


class WorkerView:
    def __init__(self) -> None:
        self.last: dict[str, Last] = {}
        self.prefill_tokens: collections.Counter[str] = collections.Counter()
        self.decode_tokens: collections.Counter[str] = collections.Counter()  # prompt tokens past prefill
        self.pending_routes = 0
        self.migrations: collections.Counter[tuple[str, str]] = collections.Counter()  # (model, type) -> count

    @contextlib.contextmanager
    def routing(self) -> Iterator[None]:
        """Around a Route call: the request waits on the router (its queue, when the model is busy)."""
        self.pending_routes += 1
        try:
            yield
        finally:
            self.pending_routes -= 1

    def choice(self, model: str, worker_id: str, prefill_worker_id: str, prompt_tokens: int) -> ChoiceLoad:
        """A routed choice: its prompt is prefill load on the worker that computes it until the first output,
        then decode load (its KV blocks: the collector divides by the model's block size) on its decode worker.
        A worker with data-parallel ranks is named by the rank's target id (services/common/dp_ranks.py)."""
        return ChoiceLoad(self, model, worker_id, prefill_worker_id or worker_id, prompt_tokens)

    def forget(self, live: set[str]) -> None:
        """Drops what is kept of workers that are no longer registered (every rank of one)."""
        for table in (self.last, self.prefill_tokens, self.decode_tokens):
            for worker in [w for w in table if split_target(w)[0] not in live]:
                del table[worker]


class ChoiceLoad:
    """One choice's load, from its route to its end (``ended``, also when it fails)."""

    def __init__(self, view: WorkerView, model: str, decode: str, first: str, prompt_tokens: int):
        self._view, self._model = view, model
        self._decode, self._first = decode, first  # the decode worker; the one that computes the prompt
        self._prompt = prompt_tokens
        self._started = time.monotonic()
        self._first_output: float | None = None
        self._ended = False
        view.prefill_tokens[first] += prompt_tokens

    def first_output(self, prompt_tokens: int) -> None:
        """The first output: the prompt is computed; its blocks are held on the decode worker from now."""
        if self._first_output is not None:
            return
        self._first_output = now = time.monotonic()
        view = self._view
        view.prefill_tokens[self._first] -= self._prompt
        view.decode_tokens[self._decode] += self._prompt
        last = view.last.setdefault(self._first, Last())
        last.ttft_s, last.input_tokens = now - self._started, prompt_tokens or self._prompt

    def moved(self, worker_id: str, prefill_worker_id: str) -> None:
        """A response named a new worker: a decode leg's start (with its prefill worker), else a migration."""
        if prefill_worker_id or worker_id == split_target(self._decode)[0]:
            return  # a decode leg's start, or its own worker (responses name the worker, not its rank)
        view = self._view
        view.migrations[(self._model, ONGOING_REQUEST if self._first_output is not None else NEW_REQUEST)] += 1
        if self._first_output is not None:
            view.decode_tokens[self._decode] -= self._prompt
            view.decode_tokens[worker_id] += self._prompt
        else:  # the new worker computes the prompt
            view.prefill_tokens[self._first] -= self._prompt
            view.prefill_tokens[worker_id] += self._prompt
            self._first = worker_id
        self._decode = worker_id

    def ended(self, completion_tokens: int) -> None:
        """The choice is over (a second call, from the request's cleanup, does nothing)."""
        if self._ended:
            return
        self._ended = True
        view = self._view
        if self._first_output is None:
            view.prefill_tokens[self._first] -= self._prompt
            return
        view.decode_tokens[self._decode] -= self._prompt
        if completion_tokens > 1:
            gap = (time.monotonic() - self._first_output) / (completion_tokens - 1)
            view.last.setdefault(self._decode, Last()).itl_s = gap


@functools.cache
def worker_view() -> WorkerView:
    """The process's view (one per process, as the request recorder: frontend_metrics.py)."""
    return WorkerView()
