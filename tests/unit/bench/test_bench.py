"""The load generator's framing, SSE accounting and CPU readings, against a tiny local SSE server.

Run with ``.venv/bin/pytest bench/tests`` (not collected by the default ``tests/`` run).
"""

from __future__ import annotations

import asyncio
import os

import orjson
import pytest

from bench import cpu
from bench.http import ChunkedDecoder
from bench.loadgen import LoadSpec, RequestResult, SseParser, run_load
from bench.prompts import WORDS, PromptFactory
from bench.stats import percentile, summarize

pytestmark = pytest.mark.unit


def _chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def test_chunked_decoder_handles_any_split():
    raw = _chunked(b"data: a\n\n", b"data: bb\n\n", b"x" * 300)
    for step in (1, 2, 7, len(raw)):
        d = ChunkedDecoder()
        out = b"".join(d.feed(raw[i:i + step]) for i in range(0, len(raw), step))
        assert out == b"data: a\n\ndata: bb\n\n" + b"x" * 300 and d.done


def _frame(obj) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def test_sse_parser_counts_content_events_per_arrival_and_usage():
    r = RequestResult(start=0.0)
    p = SseParser(r)
    role = _frame({"choices": [{"delta": {"role": "assistant", "content": ""}}]})
    tok = _frame({"choices": [{"delta": {"content": "x"}}]})
    usage = _frame({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 6,
                                             "prompt_tokens_details": {"cached_tokens": 4}}})
    p.feed(1.0, role + tok[:5])  # an event split across reads
    p.feed(1.5, tok[5:] + tok)
    p.feed(2.5, tok + usage + b"data: [DONE]\n\n")
    assert r.ok and r.first_token == 1.5 and r.arrivals == [(1.5, 2), (2.5, 1)]
    assert (r.prompt_tokens, r.completion_tokens, r.cached_tokens) == (9, 6, 4)
    chunk, token = r.itl_gaps()  # 3 events carried 6 tokens: 2 per event
    assert chunk == [1.0] and token == [0.5, 0.5]


def test_percentile_interpolates():
    assert percentile([1, 2, 3, 4], 50) == 2.5 and percentile([5], 99) == 5


def test_prompts_are_distinct_and_sized():
    f = PromptFactory(50, shared_prefix_tokens=20, seed=3)
    a, b = f.next_prompt(), f.next_prompt()
    assert a != b and len(a.split()) == len(b.split()) == 50
    assert a.split()[:20] == b.split()[:20] and set(a.split()) <= set(WORDS)


def test_cpu_reading_grows_with_work():
    before = cpu.read_cpu_ms(os.getpid())
    sum(i * i for i in range(3_000_000))
    assert cpu.read_cpu_ms(os.getpid()) > before
    assert cpu.read_cpu_ms(2**22 + 12345) is None
    me = cpu.sample({"me": os.getpid()})
    # Per-thread counters only cover live threads; in a long test session they may trail the tick total.
    assert 0 < me.ms["me"] <= me.tick_ms["me"] + 3 * cpu.TICK_MS
    u = cpu.usage_between(cpu.CpuSample({"gateway-0": 10, "mocker-0": 5, "mocker-1": 5}, {}),
                          cpu.CpuSample({"gateway-0": 30, "mocker-0": 15}, {}))
    assert u.by_group() == {"gateway": 20, "workers": 10} and u.missing == ["mocker-1"]
    assert u.per_request(10)["total"] == 3


async def _sse_server(reader, writer):
    """Answers each POST with 4 one-token events then usage, as chunked SSE, keeping the connection."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            body = orjson.loads(await reader.readexactly(length))
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            for i in range(body["max_tokens"]):
                writer.write(_chunked(_frame({"choices": [{"delta": {"content": f"t{i}"}}]}))[:-5])
                await writer.drain()
                await asyncio.sleep(0.002)
            tail = _frame({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": body["max_tokens"]}})
            writer.write(_chunked(tail + b"data: [DONE]\n\n"))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


async def test_closed_loop_against_local_sse_server():
    server = await asyncio.start_server(_sse_server, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        spec = LoadSpec(url=f"http://127.0.0.1:{port}", model="m", concurrency=3, requests=10, max_tokens=4,
                        duration_s=10)
        load = await asyncio.wait_for(run_load(spec, PromptFactory(20, seed=1)), 15)
    finally:
        server.close()
    s = summarize(load)
    assert (s.sent, s.ok, s.errors) == (10, 10, 0)
    assert s.mean_completion_tokens == 4 and s.tokens_per_arrival == 1.0
    assert 1.0 < s.itl_ms[50] < 50 and s.ttft_ms[50] < 1000
