"""``python -m bench multiturn``: preprocessor CPU per request on multi-turn chat, with and without the prefix cache
(services/preprocessor/core/prefix_cache.py), for each ``--tokenizer`` backend (issue 40, item 2).

The workload: ``--sessions`` conversations of ``--turns`` turns each, sent turn by turn across all sessions (turn 1
of every session, then turn 2, ...), as concurrent agents would. Every session shares one system prompt (half of
them also offer two tools); each turn adds a user message of 40-120 words, and each later turn also carries the
previous answer (80-250 words) in its history. Every round draws new messages (its own seed), so a round's
conversations are new to a cache that the previous round filled.

Three levels, each measured as CPU time of the process doing the work, per request:
- ``core``: the chat renderer alone (render the template, encode), in this process;
- ``preprocessor``: ``Preprocessor.preprocess`` in this process (plus validation, block hashes, the response proto);
- ``service``: the same behind its gRPC servicer in a child process (``--serve``), driven one request at a time
  from here; the child's CPU (all its threads) is what is counted.

Each (backend, cache) pair's ids, at every level, must equal those of the first backend's uncached core, or the
bench exits non-zero: identical ids are part of the claim.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from meshfront.common.v1 import common_pb2
from meshfront.preprocessor.v1 import preprocessor_pb2

from bench.cli_common import emit, machine_line
from bench.tokenizers import prompts

BACKENDS = ("default", "fastokens")
SYSTEM = ("You are Meshfront's support agent. Answer in the user's language, cite the documentation section you "
          "rely on, keep answers short unless asked for detail, never invent flags, and say so when unsure. ") * 6
TOOLS = [{"type": "function", "function": {"name": name, "description": f"{name} for a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    for name in ("get_weather", "get_time")]
MODEL = "meshfront/demo-qwen"
LEGEND = ("ms/req: CPU milliseconds per request of the process doing the work (median of the rounds); core: render and "
          "encode; preprocessor: Preprocessor.preprocess in-process; service: its gRPC servicer in a child process. "
          "x: uncached over cached. hit: share of prompt tokens reused from an earlier turn. core, cache forced: the "
          "cache used over fastokens, where the preprocessor does not use it.")


def workload(sessions: int, turns: int, seed: int) -> list[preprocessor_pb2.PreprocessRequest]:
    """Turn-major: every session's turn 1, then every session's turn 2, ..."""
    rng = random.Random(seed)
    pool = prompts(4000, 1, seed)  # words: English, made-up, code, numbers, CJK, emoji (bench/tokenizers.py)

    def words(lo: int, hi: int) -> str:
        return " ".join(rng.choice(pool) for _ in range(rng.randint(lo, hi)))

    histories = [[{"role": "system", "content": SYSTEM}] for _ in range(sessions)]
    out = []
    for turn in range(turns):
        for s, history in enumerate(histories):
            if turn:
                history.append({"role": "assistant", "content": words(80, 250)})
            history.append({"role": "user", "content": words(40, 120)})
            out.append(preprocessor_pb2.PreprocessRequest(
                request=common_pb2.PreprocessedRequest(request_id=f"s{s}t{turn}", model=MODEL),
                messages_json=json.dumps(history), tools_json=json.dumps(TOOLS) if s % 2 else ""))
    return out


def _card(model_dir: str):
    from services.common.discovery import ModelCard

    # 32k context as registered by its workers: the demo directory says 4k, shorter than eight long turns.
    return ModelCard(name=MODEL, model_dir=model_dir, tool_call_parser="hermes", reasoning_parser="qwen3",
                     context_length=32768)


def _artifact_cache(backend: str):
    from services.common.tokenizer_files import TokenizerOptions
    from services.preprocessor.core.artifacts import ArtifactCache

    return ArtifactCache(TokenizerOptions(backend=backend, fallback=False))  # fastokens or fail, never a fallback


def _preprocessor(model_dir: str, artifacts, cache_bytes: int):
    from services.preprocessor.core.renderers import OursChatRenderer
    from services.preprocessor.service import Preprocessor

    return Preprocessor({MODEL: _card(model_dir)}.get, artifacts, chat_renderer=OursChatRenderer(cache_bytes))


def _cpu_ms() -> float:
    return time.process_time() * 1e3


def run_core(renderer, artifacts, reqs) -> tuple[float, list[list[int]]]:
    from services.preprocessor.core.prompt import ChatInput

    chats = [ChatInput(r.messages_json, r.tools_json) for r in reqs]
    start = _cpu_ms()
    ids = [renderer.prepare_chat(artifacts, c).token_ids for c in chats]
    return (_cpu_ms() - start) / len(reqs), ids


def run_core_forced(cache, artifacts, reqs) -> tuple[float, list[list[int]]]:
    """The core with the prefix cache used over an encoder the preprocessor does not use it over (fastokens):
    what it would cost there."""
    import functools

    from services.preprocessor.core.prefix_cache import Cuts
    from services.preprocessor.core.prompt import ChatInput, encode, render_chat_prompt

    cuts = Cuts.of(artifacts.tokenizer.get_added_tokens_decoder())
    chats = [ChatInput(r.messages_json, r.tools_json) for r in reqs]
    encode_fn = functools.partial(encode, artifacts)
    start = _cpu_ms()
    ids = [cache.encode(artifacts.model_dir, artifacts.encoder, cuts, render_chat_prompt(artifacts, c), encode_fn)
           for c in chats]
    return (_cpu_ms() - start) / len(reqs), ids


def run_inprocess(pre, reqs) -> tuple[float, list[list[int]]]:
    async def go():
        start = _cpu_ms()
        out = [list((await pre.preprocess(r)).request.token_ids) for r in reqs]
        return (_cpu_ms() - start) / len(reqs), out

    return asyncio.run(go())


class Served:
    """A preprocessor behind its gRPC servicer in a child process (``--serve``)."""

    def __init__(self, backend: str, cache_bytes: int):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.multiturn", "--serve", "--tokenizer", backend,
             "--cache-bytes", str(cache_bytes)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        if line[:1] != ["READY"]:
            raise SystemExit(f"the served preprocessor did not start: {line}")
        self.address = line[1]

    def run(self, reqs) -> tuple[float, list[list[int]]]:
        import grpc
        from meshfront.preprocessor.v1 import preprocessor_pb2_grpc

        from bench.cpu import read_threads_cpu_ms

        async def go():
            async with grpc.aio.insecure_channel(self.address) as channel:
                stub = preprocessor_pb2_grpc.PreprocessorServiceStub(channel)
                before = read_threads_cpu_ms(self.proc.pid) or 0.0
                out = [list((await stub.Preprocess(r)).request.token_ids) for r in reqs]
                after = read_threads_cpu_ms(self.proc.pid) or 0.0
                return (after - before) / len(reqs), out

        return asyncio.run(go())

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def serve(backend: str, cache_bytes: int) -> None:
    from services.common.grpc_server import GrpcServer
    from services.models.build import default_test_model_dir
    from services.preprocessor.server import add_to_server

    model_dir = str(default_test_model_dir())
    pre = _preprocessor(model_dir, _artifact_cache(backend), cache_bytes)

    async def go():
        await pre.warm(_card(model_dir))
        server = GrpcServer("preprocessor", "127.0.0.1", 0, grace_s=0)
        add_to_server(server, pre)
        await server.start()
        print(f"READY {server.address}", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the bench closes it
        await server.stop()

    asyncio.run(go())


def measure(args: argparse.Namespace) -> tuple[list[str], dict]:
    """The table's rows and {(backend, cache, level): [ms per round]}."""
    from services.models.build import default_test_model_dir
    from services.preprocessor.core.prefix_cache import PrefixCache
    from services.preprocessor.core.renderers import OursChatRenderer

    model_dir = str(default_test_model_dir())
    figures: dict[tuple[str, bool, str], list[float]] = {}
    hits: dict[str, list[float]] = {}
    bypassed: set[str] = set()  # backends the preprocessor does not use the cache over
    reference: dict[int, list[list[int]]] = {}
    for backend in args.tokenizer:
        loaded = _artifact_cache(backend)  # one loaded tokenizer per backend, for every level in this process
        artifacts = loaded.get(model_dir)
        pres = {cached: _preprocessor(model_dir, loaded, args.cache_bytes if cached else 0) for cached in (False, True)}
        for pre in pres.values():
            asyncio.run(pre.warm(_card(model_dir)))
        served = {cached: Served(backend, args.cache_bytes if cached else 0) for cached in (False, True)}
        try:
            for number in range(args.rounds):
                reqs = workload(args.sessions, args.turns, seed=1000 + number)
                warm = workload(1, 1, seed=99 + number)  # a first request per server: artifacts, code paths
                for s in served.values():
                    s.run(warm)
                for cached in (False, True):
                    # Each level gets its own preprocessor (and cache): what one level fills, another cannot use.
                    renderer = OursChatRenderer(args.cache_bytes if cached else 0)
                    caches = {"core": renderer.prefix_cache}  # whose hit share is reported
                    levels: dict[str, Callable] = {
                        "core": lambda r=renderer, a=artifacts, q=reqs: run_core(r, a, q),
                        "preprocessor": lambda p=pres[cached], q=reqs: run_inprocess(p, q),
                        "service": lambda s=served[cached], q=reqs: s.run(q)}
                    if artifacts.prefix_cuts is None:  # not used over this encoder: what it would cost
                        bypassed.add(backend)
                        forced = caches["core, cache forced"] = PrefixCache(args.cache_bytes if cached else 0)
                        levels["core, cache forced"] = lambda c=forced, a=artifacts, q=reqs: run_core_forced(c, a, q)
                    for level, fn in levels.items():
                        ms, ids = fn()
                        expected = reference.setdefault(number, ids)
                        if ids != expected:
                            raise SystemExit(f"{backend} cache={cached} {level} round {number}: ids differ from "
                                             f"the uncached {args.tokenizer[0]} core's")
                        figures.setdefault((backend, cached, level), []).append(ms)
                        if cached and (used := caches.get(level)) is not None and used.stats.misses + used.stats.hits:
                            reused, encoded = used.stats.reused_tokens, used.stats.encoded_tokens
                            hits.setdefault(backend, []).append(reused / max(1, reused + encoded))
                emit(f"# round {number + 1}/{args.rounds} {backend}: " + ", ".join(
                    f"{lv} {figures[(backend, False, lv)][-1]:.2f} -> {figures[(backend, True, lv)][-1]:.2f} ms"
                    for lv in levels))
        finally:
            for s in served.values():
                s.close()
    return table(args.tokenizer, figures, hits, bypassed), figures


def table(backends: tuple[str, ...], figures: dict, hits: dict[str, list[float]], bypassed: set[str]) -> list[str]:
    rows = ["| tokenizer | level | no cache ms/req | cache ms/req | x | hit |", "|---|---|---|---|---|---|"]
    for backend in backends:
        for level in ("core", "core, cache forced", "preprocessor", "service"):
            if (backend, False, level) not in figures:
                continue
            off = statistics.median(figures[(backend, False, level)])
            on = statistics.median(figures[(backend, True, level)])
            used = backend in hits and (backend not in bypassed or level.endswith("forced"))
            hit = f"{statistics.median(hits[backend]) * 100:.0f} %" if used else "not used"
            rows.append(f"| {backend} | {level} | {off:.2f} | {on:.2f} | {off / on:.2f} | {hit} |")
    return rows


def add_parser(sub) -> None:
    m = sub.add_parser("multiturn", help="preprocessor CPU per request on multi-turn chat, prefix cache on and off, "
                       "per --tokenizer backend, in-process and behind gRPC (bench/multiturn.py)")
    add_flags(m)


def add_flags(p: argparse.ArgumentParser) -> None:
    from services.preprocessor.core.renderers import DEFAULT_PREFIX_CACHE_BYTES

    p.add_argument("--sessions", type=int, default=32)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3, help="rounds, each with new messages; medians are reported")
    p.add_argument("--tokenizer", type=lambda t: tuple(x for x in t.split(",") if x), default=BACKENDS,
                   help="comma list of --tokenizer backends (default default,fastokens)")
    p.add_argument("--cache-bytes", type=int, default=DEFAULT_PREFIX_CACHE_BYTES,
                   help="--tokenizer-prefix-cache-bytes of the cached runs")
    p.add_argument("--markdown", default="", help="append a markdown section with the table to this file")


def run_cli(args: argparse.Namespace, command: str) -> int:
    import datetime

    started = datetime.datetime.now().astimezone()
    emit(f"# {started:%Y-%m-%d %H:%M %Z}; {machine_line()}")
    emit(f"# {args.sessions} sessions x {args.turns} turns, {args.rounds} rounds, "
         f"tokenizers {','.join(args.tokenizer)}")
    rows, _ = measure(args)
    table = "\n".join(rows)
    emit("\n" + table + "\n\n" + LEGEND)
    if args.markdown:
        with Path(args.markdown).open("a") as f:
            f.write(f"\n### `{command}`\n\n{started:%Y-%m-%d %H:%M %Z}. Machine: {machine_line()}.\n\n{table}\n\n"
                    f"{LEGEND}\n")
    return 0


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.multiturn")
    p.add_argument("--serve", action="store_true", help="serve one preprocessor over gRPC until stdin closes")
    p.add_argument("--tokenizer", default="default", choices=BACKENDS)
    p.add_argument("--cache-bytes", type=int, default=0)
    args = p.parse_args()
    if not args.serve:
        p.error("run the bench as python -m bench multiturn")
    os.environ.setdefault("MESHFRONT_LOG_LEVEL", "WARNING")
    serve(args.tokenizer, args.cache_bytes)


if __name__ == "__main__":
    main()
