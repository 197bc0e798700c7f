"""Client side of the chaos tests: concurrent SSE streams through Envoy, collected as text."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import socket
import time

import httpx
import orjson


@dataclasses.dataclass
class StreamResult:
    status: int
    text: str = ""
    finish: str | None = None
    done: bool = False
    error: dict | None = None
    first_token_at: float | None = None
    # Longest silence between two content chunks: how long a fault stalled this stream.
    max_gap: float = 0.0
    ended_at: float | None = None
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    body: bytes = b""


def chat(model: str, i: int, max_tokens: int, **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": f"chaos prompt number {i}"}],
            "max_tokens": max_tokens, "seed": 1000 + i, **extra}


async def stream_chat(client: httpx.AsyncClient, url: str, body: dict,
                      on_token: asyncio.Event | None = None) -> StreamResult:
    """Runs one streaming chat completion; sets ``on_token`` once the first content arrived."""
    async with client.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}) as r:
        result = StreamResult(r.status_code, headers=dict(r.headers))
        if r.status_code != 200:
            result.body = await r.aread()
            return result
        parts: list[str] = []
        last = 0.0
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                result.done = True
                break
            event = orjson.loads(data)
            if "error" in event:
                result.error = event["error"]
                continue
            for choice in event.get("choices", ()):
                content = choice["delta"].get("content")
                if content:
                    parts.append(content)
                    now = time.monotonic()
                    if result.first_token_at is not None:
                        result.max_gap = max(result.max_gap, now - last)
                    last = now
                    if result.first_token_at is None:
                        result.first_token_at = time.monotonic()
                        if on_token is not None:
                            on_token.set()
                if choice.get("finish_reason"):
                    result.finish = choice["finish_reason"]
        result.text = "".join(parts)
        result.ended_at = time.monotonic()
        return result


async def run_streams(url: str, bodies: list[dict], during=None, timeout: float = 60.0) -> list[StreamResult]:
    """Runs every body as a concurrent stream; ``during(events)`` runs alongside (the fault)."""
    limits = httpx.Limits(max_connections=len(bodies) + 10, max_keepalive_connections=len(bodies) + 10)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        events = [asyncio.Event() for _ in bodies]
        tasks = [asyncio.create_task(stream_chat(client, url, b, e)) for b, e in zip(bodies, events, strict=True)]
        if during is not None:
            await during(events)
        return await asyncio.wait_for(asyncio.gather(*tasks), timeout)


async def most_streaming(events: list[asyncio.Event], share: float = 0.9, within: float = 1.0) -> None:
    """Returns once ``share`` of the streams have their first token, or ``within`` s after the first had.

    Waiting for every stream lets one straggler (a late connection, a client behind on a loaded machine)
    hold a fault back until the others have ended, and the fault then disturbs nothing.
    """
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    for waiter in waiters:
        waiter.cancel()  # the rest are polled below; none is left pending
    deadline = time.monotonic() + within
    while sum(e.is_set() for e in events) < share * len(events) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


def stream_then_hang_up(port: int, body: dict, frames: int) -> datetime.datetime:
    """Reads a few SSE frames over a raw socket, then resets it mid-stream (what a killed client does).

    Returns when the client left, to compare with the worker's "aborted by the caller" log time.
    """
    payload = orjson.dumps({**body, "stream": True})
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  b"content-length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        seen = b""
        while seen.count(b"data: ") < frames:
            chunk = s.recv(65536)
            assert chunk, "stream ended early"
            seen += chunk
        assert b"200 OK" in seen
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST now
    return datetime.datetime.now()
