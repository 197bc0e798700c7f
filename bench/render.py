"""``python -m bench.render``: the gateway's per-token cost, proto to SSE bytes, before and after the fast path.

One streamed request the way a paced engine feeds it: 64 postprocessor responses of one token (a few
characters) each, the first with the prompt counts (its chunk carries the role), the last with the
finish reason. Each is turned into a ``Delta`` (``Pipeline._delta``) and rendered alone
(``ChatRenderer.sse`` / ``CompletionRenderer.sse``), as ``Pipeline.run`` yields them for n=1; the renderer
gets the server's ``ResponseExtensions`` with no extra fields, so the per-chunk ``chunk_nvext`` call is counted too.

"before" is the frozen pre-fast-path copy in bench/legacy_render.py, which
tests/unit/gateway/test_render_fast_path.py also holds the product to (the product carries no old code),
"after" is the product. Figures are µs per delta: the median over rounds of the ``_delta`` + ``sse`` loop,
and of the whole request (renderer set-up and ``sse_end`` included). Single-threaded and short; run it on
an otherwise idle core.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

from meshfront.common.v1 import common_pb2
from meshfront.postprocessor.v1 import postprocessor_pb2

from bench.legacy_render import LegacyRenderer, legacy_delta
from services.gateway.core.nvext import NvExt
from services.gateway.core.pipeline import Pipeline
from services.gateway.core.trace import RequestTrace
from services.gateway.openai.extensions import ResponseExtensions
from services.gateway.openai.render import renderer_for

TOKENS = 64
WORDS = [" the", " model", " said", ",", " and", " then", " it", " wrote", " more", ".", "\n", " \"ok\""]


def stream() -> list[postprocessor_pb2.GenerateResponse]:
    out = [postprocessor_pb2.GenerateResponse(text=WORDS[i % len(WORDS)], completion_tokens=1)
           for i in range(TOKENS)]
    out[0].prompt_tokens, out[0].cached_tokens = 412, 256
    out[-1].finish_reason = common_pb2.FINISH_REASON_EOS
    return out


def _request(make: Callable[[], Any], delta: Callable[..., Any], responses: list[Any]) -> tuple[int, int]:
    """One request; (ns in the _delta + sse loop, ns for all of it)."""
    t0 = time.perf_counter_ns()
    r = make()
    t1 = time.perf_counter_ns()
    for resp in responses:
        r.sse([delta(0, True, 412, resp)])
    t2 = time.perf_counter_ns()
    r.sse_end()
    return t2 - t1, time.perf_counter_ns() - t0


def measure(make: Callable[[], Any], delta: Callable[..., Any], rounds: int, per_round: int) -> tuple[float, float]:
    """Median µs per delta over rounds: (the loop, the whole request)."""
    responses = stream()
    loop, whole = [], []
    gc.collect()
    for _ in range(rounds):
        a = b = 0
        for _ in range(per_round):
            x, y = _request(make, delta, responses)
            a, b = a + x, b + y
        loop.append(a / per_round / TOKENS / 1000)
        whole.append(b / per_round / TOKENS / 1000)
    return statistics.median(loop), statistics.median(whole)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.render", description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--requests", type=int, default=200, help="requests per round")
    args = p.parse_args(argv)
    print(f"{TOKENS} one-token deltas per request, {args.rounds} rounds of {args.requests} requests; µs per delta")
    print(f"{'include_usage':<14} {'chat':<5} {'':<7} {'_delta+sse':>10} {'request':>8}")
    for include_usage in (False, True):
        for chat in (True, False):
            def ext() -> ResponseExtensions:
                return ResponseExtensions(NvExt(), RequestTrace(), "r")
            kw = {"chat": chat, "request_id": "chatcmpl-3f2a9c0e8b7d4e21", "model": "Qwen/Qwen3-0.6B",
                  "n_choices": 1, "want_logprobs": False, "include_usage": include_usage}
            sides: list[tuple[str, Callable[[], Any], Callable[..., Any]]] = [
                ("before", lambda kw=kw: LegacyRenderer(**kw, nvext=ext()), legacy_delta),
                ("after", lambda kw=kw: renderer_for(**kw, nvext=ext()), Pipeline._delta)]
            for name, make, delta in sides:
                loop, whole = measure(make, delta, args.rounds, args.requests)
                print(f"{str(include_usage):<14} {str(chat):<5} {name:<7} {loop:>10.2f} {whole:>8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
