"""Closed-loop streaming load: ``concurrency`` connections, each sending its next request as soon as
the previous one ends, until ``requests`` have been sent or the deadline passes.

Timing is taken per socket read ("arrival"): every SSE event that came in one read arrived at the
same instant. TTFT is the time from writing the request to the first arrival holding content.
Inter-token latency is recorded two ways: per arrival (the gap between consecutive arrivals that
hold content) and per token (each such gap divided among the tokens it carried). SSE events do not
say how many tokens they hold when the server coalesces, so an arrival's tokens are its content
events scaled by ``usage.completion_tokens / content events`` of the whole request — exact when
every event is one token, the mean otherwise.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from urllib.parse import urlsplit

import orjson

from bench.http import Connection, HttpError
from bench.prompts import PromptFactory

CHAT_PATH = "/v1/chat/completions"


@dataclasses.dataclass(frozen=True)
class LoadSpec:
    url: str
    model: str
    concurrency: int
    requests: int
    max_tokens: int = 64
    # Whole-level bound: no request starts after it and running ones are cancelled at it.
    duration_s: float = 120.0
    request_timeout_s: float = 60.0
    ignore_eos: bool = True
    min_tokens: int = 0  # > 0: sent as ``min_tokens`` (an engine that may stop early must not)


@dataclasses.dataclass
class RequestResult:
    start: float
    end: float = 0.0
    first_token: float | None = None
    # (arrival time, content events in that arrival), in order.
    arrivals: list[tuple[float, int]] = dataclasses.field(default_factory=list)
    content_events: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    done: bool = False
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.done and not self.error

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start

    def itl_gaps(self) -> tuple[list[float], list[float]]:
        """(per-arrival gaps, per-token gaps) after the first content arrival."""
        per_chunk: list[float] = []
        per_token: list[float] = []
        tokens_per_event = self.completion_tokens / self.content_events if self.content_events else 1.0
        for (t0, _), (t1, events) in itertools.pairwise(self.arrivals):
            gap = t1 - t0
            per_chunk.append(gap)
            tokens = events * tokens_per_event
            whole = max(1, round(tokens))
            per_token.extend([gap / tokens] * whole)
        return per_chunk, per_token


@dataclasses.dataclass
class LoadResult:
    spec: LoadSpec
    started: float
    finished: float
    results: list[RequestResult]
    timed_out: bool = False

    @property
    def wall_s(self) -> float:
        return self.finished - self.started


def chat_body(model: str, prompt: str | list[dict], max_tokens: int, ignore_eos: bool, min_tokens: int = 0) -> bytes:
    """A streamed chat completion; ``prompt`` is the user message's content (text, or parts: bench/prompts.py)."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True},
            "ignore_eos": ignore_eos}
    if min_tokens:
        body["min_tokens"] = min_tokens
    return orjson.dumps(body)


class SseParser:
    """Splits SSE payload into events and folds them into a RequestResult."""

    def __init__(self, result: RequestResult):
        self.result = result
        self._tail = b""

    def feed(self, arrival: float, payload: bytes) -> None:
        frames = (self._tail + payload).split(b"\n\n") if self._tail else payload.split(b"\n\n")
        self._tail = frames.pop()
        content = 0
        for frame in frames:
            content += self._event(frame)
        if content:
            r = self.result
            if r.first_token is None:
                r.first_token = arrival
            r.arrivals.append((arrival, content))
            r.content_events += content

    def _event(self, frame: bytes) -> int:
        if not frame.startswith(b"data: "):
            return 0
        data = frame[6:]
        if data == b"[DONE]":
            self.result.done = True
            return 0
        chunk = orjson.loads(data)
        if "error" in chunk:
            self.result.error = str(chunk["error"].get("message", chunk["error"]))[:300]
            return 0
        usage = chunk.get("usage")
        if usage:
            self.result.prompt_tokens = usage.get("prompt_tokens", 0)
            self.result.completion_tokens = usage.get("completion_tokens", 0)
            details = usage.get("prompt_tokens_details") or {}
            self.result.cached_tokens = details.get("cached_tokens") or 0
        choices = chunk.get("choices")
        if choices and choices[0].get("delta", {}).get("content"):
            return 1
        return 0


async def one_request(conn: Connection, body: bytes, timeout_s: float) -> RequestResult:
    result = RequestResult(start=time.monotonic())
    parser = SseParser(result)
    try:
        async with asyncio.timeout(timeout_s):
            async for arrival, payload in conn.post_stream(CHAT_PATH, body):
                parser.feed(arrival, payload)
        if not result.done and not result.error:
            result.error = "stream ended without [DONE]"
    except TimeoutError:
        result.error = f"timed out after {timeout_s:g}s"
        conn.close()
    except (HttpError, OSError, asyncio.IncompleteReadError, ValueError) as e:
        result.error = f"{type(e).__name__}: {e}"[:300]
    result.end = time.monotonic()
    return result


async def open_connections(url: str, count: int) -> list[Connection]:
    """Connects up front, so connection setup stays out of the measured window."""
    parts = urlsplit(url)
    conns = [Connection(parts.hostname or "127.0.0.1", parts.port or 80) for _ in range(count)]
    await asyncio.gather(*(c.connect() for c in conns))
    return conns


async def run_load(spec: LoadSpec, prompts: PromptFactory, conns: list[Connection] | None = None) -> LoadResult:
    """Runs one closed-loop level; ``conns`` (one per concurrency slot) are reused when given."""
    own = conns is None
    if conns is None:
        conns = await open_connections(spec.url, spec.concurrency)
    bodies = [chat_body(spec.model, prompts.next_prompt(), spec.max_tokens, spec.ignore_eos, spec.min_tokens)
              for _ in range(spec.requests)]  # built before the window: prompt building is client work
    results: list[RequestResult] = []
    started = time.monotonic()
    deadline = started + spec.duration_s

    async def slot(conn: Connection) -> None:
        while bodies and time.monotonic() < deadline:
            body = bodies.pop()
            timeout = max(0.1, min(spec.request_timeout_s, deadline - time.monotonic()))
            results.append(await one_request(conn, body, timeout))

    await asyncio.gather(*(slot(c) for c in conns[: spec.concurrency]))
    finished = time.monotonic()
    if own:
        for c in conns:
            c.close()
    return LoadResult(spec, started, finished, results, timed_out=bool(bodies))
