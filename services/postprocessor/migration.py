"""Request migration: a worker that dies mid-generation is replaced without the client noticing.

The postprocessor owns the sequence's state (generated ids, detokenizer window, held-back stop-string
text, parser state), so it is the one place where a continuation can be spliced in seamlessly:
when the worker stream fails with a retriable error it asks the router for another worker
(excluding every worker this request already failed on), re-sends the prompt with the generated ids
appended and ``max_tokens`` / ``min_tokens`` reduced by their number, and keeps feeding the *same*
decoder. The client sees one stream with no duplicated or missing token (docs/architecture.md,
"Migration"; Dynamo's ``--migration-limit``, dynamo-frontend.md §5.5).

A request is thus a loop of attempts (attempt.py), one per route: ``Postprocessor.generate`` runs one, and when
it fails, ``Migration.move`` says where the next one runs and what it is asked, or re-raises the failure.

Every other option is stateless per token on the worker (sampling knobs, stop conditions, logprobs)
or kept here (stop strings, tool-call and reasoning parsing), so the extended prompt resumes it
exactly. Guided decoding is not: its grammar state lives on the worker, so a guided request whose
worker fails is refused migration and fails cleanly (503 / an in-band error), never corrupted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from typing import Protocol

from meshfront.common.v1 import common_pb2
from meshfront.postprocessor.v1 import postprocessor_pb2
from meshfront.router.v1 import router_pb2

from services.common.errors import MeshError, Overloaded, WorkerFailed
from services.postprocessor.metrics import postprocessor_metrics

log = logging.getLogger(__name__)

DEFAULT_MIGRATION_LIMIT = 3

# Failures that say nothing about the request itself: another worker may well serve it.
RETRIABLE = (WorkerFailed, Overloaded)


@dataclasses.dataclass(frozen=True)
class WorkerRoute:
    """Where one attempt runs."""

    worker_id: str  # the worker that decodes (the only one of an aggregated request)
    address: str
    # Disaggregated (docs/architecture.md, "Disaggregated prefill and decode"): the prefill leg's worker.
    prefill_worker_id: str = ""
    prefill_address: str = ""
    # The router asked to hear of this attempt's first token (a split route always does: it frees its prefill leg).
    report_first_token: bool = False
    # The workers' data-parallel ranks (services/common/dp_ranks.py): the decode (or only) worker's, which the
    # attempt's request carries (PreprocessedRequest.dp_rank), and the prefill worker's; None: no ranks.
    dp_rank: int | None = None
    prefill_dp_rank: int | None = None


class RouterClient(Protocol):
    """The part of the router the postprocessor needs (a gRPC stub wrapper or the in-process Router)."""

    async def route(self, req: router_pb2.RouteRequest) -> router_pb2.RouteResponse: ...

    async def release_batch(self, req: router_pb2.ReleaseBatchRequest) -> object: ...


def continuation(original: common_pb2.PreprocessedRequest, generated: Sequence[int],
                 into: common_pb2.PreprocessedRequest | None = None) -> common_pb2.PreprocessedRequest:
    """The request that resumes ``original`` after ``generated`` ids: prompt extended, budgets reduced. Written
    into ``into`` when given (a worker call's field: a message passed to a constructor is copied again)."""
    req = common_pb2.PreprocessedRequest() if into is None else into
    req.CopyFrom(original)
    req.token_ids.extend(generated)
    stop = req.stop
    if stop.HasField("max_tokens"):
        stop.max_tokens = max(1, stop.max_tokens - len(generated))
    if stop.HasField("min_tokens"):
        stop.min_tokens = max(0, stop.min_tokens - len(generated))
    return req


def with_rank(request: common_pb2.PreprocessedRequest, dp_rank: int | None) -> None:
    """Sets the request's data-parallel rank (None: the worker has no ranks, so none)."""
    if dp_rank is None:
        request.ClearField("dp_rank")
    else:
        request.dp_rank = dp_rank


def guided(request: common_pb2.PreprocessedRequest) -> bool:
    """Guided decoding keeps its grammar state on the worker: the generated ids alone cannot resume it
    (a continuation would restart the grammar at the generated text, and vLLM's and SGLang's grammar
    backends cannot be advanced over given tokens)."""
    return request.sampling.HasField("guided_decoding")


class Migrator:
    """Decides whether a failed attempt moves on, and where to.

    Args:
        router: where to ask for another worker; None disables migration.
        limit: how many times one request may move (0 disables migration).
        max_seq_len: a request whose prompt + generated tokens exceed this is no longer moved (None: no limit;
            Dynamo's ``--migration-max-seq-len``).
    """

    def __init__(self, router: RouterClient | None, limit: int = DEFAULT_MIGRATION_LIMIT,
                 max_seq_len: int | None = None):
        self._router = router
        self.limit = limit
        self.max_seq_len = max_seq_len
        self.migrations = 0
        self._reports: set[asyncio.Task] = set()  # first-token reports on their way (held: not collected)

    @property
    def enabled(self) -> bool:
        return self._router is not None and self.limit > 0

    async def next_route(self, request: common_pb2.PreprocessedRequest, failed: Sequence[str],
                         error: MeshError, generated: int) -> WorkerRoute:
        """Another worker for ``request``; re-raises ``error`` when the request may not move.

        Args:
            request: the original request (the router needs its id and model).
            failed: ids of the workers this request already failed on, the latest last.
            error: why the latest attempt failed.
            generated: ids generated so far (for the log).
        """
        if not isinstance(error, RETRIABLE) or not self.enabled:
            raise error
        if generated and guided(request):  # before the first token the grammar simply starts again
            log.warning("request %s not migrated: guided decoding cannot resume on another worker after %d tokens",
                        request.request_id, generated)
            raise error
        if len(failed) > self.limit:
            log.warning("request %s: migration limit %d reached", request.request_id, self.limit)
            raise error
        if self.max_seq_len is not None and len(request.token_ids) + generated > self.max_seq_len:
            # Checked here, at the failure, not per token: the token path pays nothing for the limit.
            log.warning("request %s not migrated: %d prompt + %d generated tokens exceed --migration-max-seq-len %d",
                        request.request_id, len(request.token_ids), generated, self.max_seq_len)
            postprocessor_metrics().migration_max_seq_len_exceeded.labels(request.model).inc()
            raise error
        assert self._router is not None
        try:
            route = await self._router.route(router_pb2.RouteRequest(
                request_id=request.request_id, model=request.model, prompt_tokens=len(request.token_ids) + generated,
                exclude_worker_ids=[w for w in failed if w]))
        except MeshError as e:  # no other worker (or all busy): the client gets the original failure
            log.warning("request %s cannot migrate: %s", request.request_id, e.message)
            raise error from e
        self.migrations += 1
        log.info("request %s migrates from %s to %s after %d tokens (%s)", request.request_id, failed[-1] or "?",
                 route.worker_id, generated, error.message)
        return WorkerRoute(route.worker_id, route.address, route.prefill_worker_id, route.prefill_address,
                           route.report_first_token, route.dp_rank if route.HasField("dp_rank") else None,
                           route.prefill_dp_rank if route.HasField("prefill_dp_rank") else None)

    def report_first_token(self, request_id: str) -> None:
        """Tells the router that a migrated attempt has its first token, in the background (the token is not
        held for it). The gateway reports a request's first token once, for its first attempt; the router
        booked the new attempt again (a split one with a new prefill leg), which only this report ends
        before the request's release. A lost report leaves that booking until the release, as before."""
        assert self._router is not None  # only a migration, which needs the router, asks
        task = asyncio.create_task(self._report(request_id), name=f"first-token-{request_id}")
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)

    async def close(self) -> None:
        """Drops the reports still on their way (the process is stopping: the releases free those bookings)."""
        for task in list(self._reports):
            task.cancel()
        await asyncio.gather(*self._reports, return_exceptions=True)

    async def _report(self, request_id: str) -> None:
        assert self._router is not None
        try:
            await self._router.release_batch(router_pb2.ReleaseBatchRequest(
                first_tokens=[router_pb2.FirstTokenReport(request_id=request_id)]))
        except MeshError as e:
            log.warning("request %s: the migrated attempt's first token was not reported: %s", request_id,
                        e.message)


class Migration:
    """One request's moves from worker to worker: where its next attempt runs after a failed one, and what the
    first response of a moved attempt carries (its new worker) and sets off (the router's first-token report)."""

    def __init__(self, migrator: Migrator, original: common_pb2.PreprocessedRequest):
        self._migrator = migrator
        self._original = original
        self.failed: list[str] = []  # the workers its attempts blamed, the latest last (the router avoids them)
        self._answered = False  # a response went out: the caller has reported the request's first token
        self._moved_to = ""  # after a move: the new worker, told to the caller with the attempt's first response
        self._report_first_token = False  # the moved attempt's first token is for the router to hear of here

    async def move(self, error: MeshError, blamed: str, generated: list[int],
                   ) -> tuple[WorkerRoute, common_pb2.PreprocessedRequest]:
        """The next attempt's route and request after ``error`` ended one that blames ``blamed``: the original
        request continued after the ids ``generated`` so far. Re-raises ``error`` when the request may not move."""
        metrics = postprocessor_metrics()
        metrics.worker_failures.labels(error.reason).inc()
        self.failed.append(blamed)
        route = await self._migrator.next_route(self._original, self.failed, error, len(generated))
        self._moved_to = route.worker_id
        # Before any response, the caller's own first-token report will be this attempt's.
        self._report_first_token = self._answered and route.report_first_token
        metrics.migrations.inc()
        request = continuation(self._original, generated)
        with_rank(request, route.dp_rank)  # the new worker's rank, not the old one's
        return route, request

    def first_response(self, response: postprocessor_pb2.GenerateResponse) -> None:
        """Called with each attempt's first response, before it goes out (the later ones need nothing)."""
        self._answered = True
        if self._moved_to:
            response.worker_id, self._moved_to = self._moved_to, ""
        if self._report_first_token:
            self._migrator.report_first_token(self._original.request_id)
            self._report_first_token = False
