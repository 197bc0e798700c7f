"""What one request went through in the mesh, recorded by the pipeline for ``nvext`` responses.

The pipeline fills it in as the request moves (prompt prepared, each choice routed, first and last
token); the response side reads it for Dynamo's ``nvext.extra_fields`` (``worker_id``, ``timing``)
and ``nvext.annotations`` (``formatted_prompt``, ``token_ids``). Times are ``time.monotonic()``
except ``received_unix_ms``.
"""

from __future__ import annotations

import dataclasses
import time

from services.common.decision_record import DecisionRecord


@dataclasses.dataclass(frozen=True)
class RouteHints:
    """Routing asks of a request besides its prompt (nvext.session_control, agent_hints, prompt_cache_key)."""

    session_id: str = ""
    session_action: str = ""
    session_timeout_s: int = 0
    priority_jump_s: float = 0.0
    # Disaggregated pins (nvext.prefill_worker_id / x-prefill-instance-id, nvext.decode_worker_id).
    prefill_worker_id: str = ""
    decode_worker_id: str = ""
    explain: bool = False  # nvext.extra_fields "routing": the router returns its decision record
    # (field, header): the pins the client set with a header, which the router's errors must name (core/pins.py).
    pin_names: tuple[tuple[str, str], ...] = ()
    affinity_session_id: str = ""  # the X-Dynamo-Session-ID header (RouteRequest.affinity_session_id)
    # Data-parallel rank pins (nvext.dp_rank / x-dp-rank, nvext.prefill_dp_rank / x-prefill-dp-rank); None: none.
    dp_rank: int | None = None
    prefill_dp_rank: int | None = None


@dataclasses.dataclass
class TracedPrompt:
    token_ids: list[int]
    formatted_prompt: str = ""


@dataclasses.dataclass
class RequestTrace:
    received: float = dataclasses.field(default_factory=time.monotonic)
    received_unix_ms: float = dataclasses.field(default_factory=lambda: time.time() * 1000)
    prompts: list[TracedPrompt] = dataclasses.field(default_factory=list)
    workers: dict[int, str] = dataclasses.field(default_factory=dict)  # choice index -> worker id
    # Disaggregated choices: choice index -> the prefill leg's worker (workers[] is then the decode worker).
    prefill_workers: dict[int, str] = dataclasses.field(default_factory=dict)
    # Choice index -> the router's decision record (nvext.extra_fields "routing" only); the pipeline fills in
    # its actual cached tokens at the choice's first output.
    routing: dict[int, DecisionRecord] = dataclasses.field(default_factory=dict)
    kv_transfer_ms: float | None = None  # disaggregated: prefill leg's end to the decode leg's first tokens
    routed: float | None = None  # the first choice routed
    queue_depth: int = 0
    first_token: float | None = None
    finished: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0

    def on_routed(self, index: int, worker_id: str, queue_depth: int, prefill_worker_id: str = "") -> None:
        self.workers[index] = worker_id
        if prefill_worker_id:
            self.prefill_workers[index] = prefill_worker_id
        if self.routed is None:
            self.routed = time.monotonic()
            self.queue_depth = queue_depth

    def on_output(self, prompt_tokens: int, cached_tokens: int, finished: bool, index: int = 0,
                  moved_to: str = "", prefill_worker: str = "", transfer_ms: float = 0.0) -> None:
        """A choice's output arrived; ``moved_to``: the worker it migrated to, if it just did, or its decode
        worker, with ``prefill_worker`` and ``transfer_ms``, on a disaggregated choice's first decoded output."""
        now = time.monotonic()
        if moved_to:
            self.workers[index] = moved_to
            if prefill_worker:
                self.prefill_workers[index] = prefill_worker
                self.kv_transfer_ms = round(transfer_ms, 3)
            else:  # migrated to an aggregated worker: it did the prefill too
                self.prefill_workers.pop(index, None)
        if self.first_token is None:
            self.first_token = now
        if prompt_tokens:
            self.prompt_tokens += prompt_tokens
            self.cached_tokens += cached_tokens
        if finished:
            self.finished = now

    def timing(self) -> dict[str, float | int | None]:
        """Dynamo's response ``nvext.timing``; a phase not reached yet is null."""

        def ms(start: float | None, end: float | None) -> float | None:
            return None if start is None or end is None else round((end - start) * 1000, 3)

        end = self.finished if self.finished is not None else time.monotonic()
        return {
            "request_received_ms": round(self.received_unix_ms, 3),
            "prefill_wait_time_ms": ms(self.received, self.routed),
            "prefill_time_ms": ms(self.routed, self.first_token),
            "ttft_ms": ms(self.received, self.first_token),
            "total_time_ms": ms(self.received, end),
            "kv_hit_rate": round(self.cached_tokens / self.prompt_tokens, 6) if self.prompt_tokens else None,
            "router_queue_depth": self.queue_depth,
            "kv_transfer_ms": self.kv_transfer_ms,  # null unless the request was disaggregated
        }
