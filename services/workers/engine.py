"""The contract between the worker glue and an inference engine (no grpc, no protobuf).

An engine turns one ``EngineRequest`` into an async stream of ``EngineOutput``s:

- each output carries *every* token that was ready when the consumer asked for it, so a slow
  consumer (one blocked on a gRPC write) gets many tokens per message instead of falling behind;
- the first output carries ``prompt_tokens`` and ``cached_tokens``; the last one carries a
  ``finish_reason`` other than ``NONE`` and nothing follows it;
- closing the stream early (``aclose()``, or cancelling the task iterating it) aborts the sequence
  at once and frees everything it held (KV blocks, a model lock).

``TokenStream`` is the single-producer, single-consumer buffer engines use to honour the first
rule; its producer side must be called on the event loop thread (threads use
``loop.call_soon_threadsafe``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any, Protocol

from services.workers.lora import HeldAdapter


class FinishReason(enum.IntEnum):
    """Why a sequence ended; the values equal meshfront.common.v1.FinishReason's."""

    NONE = 0
    EOS = 1
    LENGTH = 2
    STOP = 3
    CANCELLED = 4
    ERROR = 5


class EngineError(Exception):
    """The engine failed while generating (becomes WORKER_FAILED at the edge)."""


class RequestRejected(EngineError):
    """The request cannot be served as asked (becomes INVALID_REQUEST at the edge, naming ``param`` if given)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class EngineBusy(EngineError):
    """The engine's queue is full (becomes OVERLOADED: 503 with Retry-After at the edge)."""


class KvTransferFailed(EngineError):
    """A decode leg's transfer parameters cannot be resolved (the prefill worker or its held blocks are gone):
    WORKER_FAILED naming ``kv_transfer_params``, so the caller runs the prefill again rather than blaming
    this worker."""


@dataclasses.dataclass(frozen=True, slots=True)
class SamplingParams:
    """Sampling knobs; ``None`` means the engine's default."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class GuidedDecoding:
    """One output constraint (exactly one field set), as the client asked for it."""

    json_schema: str | None = None  # JSON Schema text
    json_object: bool = False  # any JSON object
    regex: str | None = None
    choice: tuple[str, ...] = ()
    grammar: str | None = None  # EBNF / GBNF text, as the engine's grammar backend reads it
    structural_tag: str | None = None  # xgrammar structural tag JSON: tool calls in the model's format

    def kind(self) -> str:
        """The constraint's name, for error messages."""
        for name in ("json_schema", "json_object", "regex", "choice", "grammar", "structural_tag"):
            if getattr(self, name):
                return name
        raise ValueError("GuidedDecoding has no constraint set")

    def as_json_schema(self) -> str | None:
        """The constraint as a JSON Schema when it is one (json_object: any object), else None."""
        if self.json_schema:
            return self.json_schema
        return '{"type": "object"}' if self.json_object else None


@dataclasses.dataclass(frozen=True, slots=True)
class MediaInput:
    """One image, video or audio clip, fetched and decoded once by the preprocessor (common.proto MediaItem).

    ``content`` holds its bytes as served (``mime_type``); ``content_hash`` is XXH3-64 of them and salts the
    KV block hashes of the blocks holding its placeholder tokens, which sit at
    ``token_ids[token_offset:token_offset + token_count]`` already expanded (token_count 0: not placed, the
    engine places it). ``uuid`` is the client's id for it (vLLM's multi_modal_uuids), or "".
    """

    modality: str
    url: str = ""
    data: str = ""
    format: str = ""
    content: bytes = b""
    mime_type: str = ""
    content_hash: int = 0
    uuid: str = ""
    token_offset: int = 0
    token_count: int = 0
    width: int = 0
    height: int = 0


def engine_token_ids(token_ids: Sequence[int], media: Sequence[MediaInput]) -> list[int]:
    """The prompt as an engine must receive it: each placed item's placeholder run collapsed to the one
    placeholder the chat template wrote. vLLM and SGLang expand every placeholder they find, an already
    expanded run included (vLLM 0.32 makes N placeholders 2N - 1; SGLang's transformers processor runs out of
    replacements and never answers), and expand the one back to the count the preprocessor placed."""
    out: list[int] = []
    cursor = 0
    for item in sorted((i for i in media if i.token_count), key=lambda i: i.token_offset):
        out += token_ids[cursor:item.token_offset + 1]
        cursor = item.token_offset + item.token_count
    out += token_ids[cursor:]
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class EngineRequest:
    """One sequence to generate."""

    request_id: str
    token_ids: Sequence[int]
    sampling: SamplingParams = SamplingParams()
    # None: up to the context window.
    max_tokens: int | None = None
    min_tokens: int = 0
    eos_token_ids: tuple[int, ...] = ()
    # Other ids that end the sequence (finish STOP); the id is the last token sent, like an EOS.
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # Number of top alternatives per token; None: no logprobs.
    logprobs: int | None = None
    # Guided decoding; None: unconstrained.
    guided: GuidedDecoding | None = None
    # Images, videos and audio of the chat, in order (only for engines whose card declares the modality).
    media: tuple[MediaInput, ...] = ()
    # Reasoning-token budget (nvext.max_thinking_tokens); None: none.
    max_thinking_tokens: int | None = None
    # Disaggregated prefill and decode, shaped like vLLM's kv_transfer_params: {"do_remote_decode": true} on a
    # prefill leg, the prefill worker's returned parameters on a decode leg; None: an ordinary request.
    kv_transfer_params: Mapping[str, Any] | None = None
    # The LoRA adapter to run with (services/workers/lora.py: name, path and the engine's id); None: the base.
    lora: HeldAdapter | None = None
    # The data-parallel rank the router chose (PreprocessedRequest.dp_rank; services/workers/dp_engines.py);
    # None: unset (a worker without ranks, or a caller that did not route by rank).
    dp_rank: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A sampled token's log probability and the best alternatives at its position."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclasses.dataclass(slots=True)
class EngineOutput:
    """Tokens produced since the previous output."""

    token_ids: list[int]
    finish_reason: FinishReason = FinishReason.NONE
    logprobs: list[TokenLogprob] | None = None
    # Set on the first output only.
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    # Set on the last output of a prefill leg: what its decode leg needs to take over the KV blocks.
    kv_transfer_params: dict[str, Any] | None = None
    # Set on the first output by engines that know it: time.time_ns() when the engine first scheduled the
    # sequence, which ends its queue wait and starts its prefill in the request's trace.
    scheduled_ns: int | None = None


class Engine(Protocol):
    """What the worker glue needs from an engine."""

    async def start(self) -> None:
        """Starts background work (a scheduler loop, a model load); idempotent."""

    async def close(self) -> None:
        """Aborts every sequence and stops background work."""

    def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        """Streams the request's outputs; see the module docstring for the rules."""


class TokenStream:
    """Buffers one sequence's tokens until its consumer takes them, all at once.

    The producer calls ``push`` / ``finish`` / ``fail``; the consumer iterates. Pushing after the
    consumer has gone (``close``) is a no-op, so an engine never needs to know about aborts.
    """

    __slots__ = ("_done", "_error", "_finish", "_logprobs", "_prompt_info", "_scheduled_ns", "_tokens", "_transfer",
                 "_waiter", "closed")

    def __init__(self, *, logprobs: bool = False) -> None:
        self._tokens: list[int] = []
        self._logprobs: list[TokenLogprob] | None = [] if logprobs else None
        self._finish = FinishReason.NONE
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._prompt_info: tuple[int, int] | None = None
        self._scheduled_ns: int | None = None
        self._transfer: dict[str, Any] | None = None
        self._done = False
        self.closed = False

    # -- producer side -------------------------------------------------------------------------

    def set_prompt_info(self, prompt_tokens: int, cached_tokens: int) -> None:
        """Records what the first output reports; call before the first push."""
        self._prompt_info = (prompt_tokens, cached_tokens)

    def mark_scheduled(self) -> None:
        """The engine scheduled the sequence (its queue wait ends); only the first call counts (a preempted
        sequence is scheduled again). One clock read per request."""
        if self._scheduled_ns is None:
            self._scheduled_ns = time.time_ns()

    def set_transfer_params(self, params: dict[str, Any]) -> None:
        """Records what the last output hands a decode leg; call before the finishing push."""
        self._transfer = params

    def push(self, token_id: int, logprob: TokenLogprob | None = None,
             finish: FinishReason = FinishReason.NONE) -> None:
        """Appends one token (and its logprob when the stream collects them)."""
        if self.closed or self._finish:
            return
        self._tokens.append(token_id)
        if self._logprobs is not None and logprob is not None:
            self._logprobs.append(logprob)
        if finish:
            self._finish = finish
        self._wake()

    def finish(self, reason: FinishReason) -> None:
        """Ends the stream without a further token."""
        if not self.closed and not self._finish:
            self._finish = reason
            self._wake()

    def fail(self, error: BaseException) -> None:
        """Ends the stream with ``error``, raised to the consumer after the pending tokens."""
        if not self.closed and not self._finish and self._error is None:
            self._error = error
            self._wake()

    def close(self) -> None:
        """The consumer is gone: drop everything pushed from now on."""
        self.closed = True

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- consumer side -------------------------------------------------------------------------

    def __aiter__(self) -> TokenStream:
        return self

    async def __anext__(self) -> EngineOutput:
        if self._done:
            raise StopAsyncIteration
        while not self._tokens and not self._finish and self._error is None:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self._error is not None and not self._tokens:
            self._done = True
            raise self._error
        return self._take()

    def _take(self) -> EngineOutput:
        out = EngineOutput(self._tokens, self._finish)
        self._tokens = []
        if self._logprobs is not None:
            out.logprobs, self._logprobs = self._logprobs, []
        if self._prompt_info is not None:
            out.prompt_tokens, out.cached_tokens = self._prompt_info
            out.scheduled_ns = self._scheduled_ns
            self._prompt_info = None
        if self._finish:
            self._done = True
            out.kv_transfer_params = self._transfer
        return out
