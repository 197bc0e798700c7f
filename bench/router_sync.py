"""``python -m bench.router_sync``: what one request costs a router replica that did not route it, in Python.

Router replicas share every booking change (services/router/events.py ``ReplicaSync``): the replica that
routes a request encodes its three events (book, first token, free), and every other replica decodes and
applies them. A ``bench scale`` row cannot separate that from gRPC and the event loop (at its 0.015-core quota
a row's CPU per request moves by 20 % between identical runs), so this times the product's own code for
``--requests`` requests, without NATS: ``encode`` (``LifecycleEvent.to_wire`` and orjson, the sender's
part), ``decode`` (orjson and ``from_wire``, each receiver's) and ``apply`` (``Router.apply(remote=True)``
with the policy and the router's metrics listening, as in a running router). It prints process CPU µs per
request for each part; a received NATS message (its wakeup and nats-py's parsing) comes on top.
"""

from __future__ import annotations

import argparse
import statistics
import time

import orjson
from prometheus_client import CollectorRegistry

from services.common.discovery import ModelCard, WorkerCard
from services.router.assembly import build_router
from services.router.core.kv_ingest import KvEventIngest
from services.router.core.lifecycle import BOOK, FIRST_TOKEN, FREE, LifecycleEvent
from services.router.metrics import RouterMetrics
from services.router.service import Router

WORKERS = 4
BLOCK = 16


def requests_events(n: int, prompt_tokens: int) -> list[tuple[LifecycleEvent, ...]]:
    blocks = prompt_tokens // BLOCK
    out = []
    for i in range(n):
        hashes = tuple(range(i * blocks, (i + 1) * blocks))
        out.append((LifecycleEvent(BOOK, f"q{i}", f"w{i % WORKERS}", "m", hashes, prompt_tokens, 0, 0),
                    LifecycleEvent(FIRST_TOKEN, f"q{i}", prompt_tokens=prompt_tokens, cached_tokens=0),
                    LifecycleEvent(FREE, f"q{i}")))
    return out


def replica(policy: str) -> Router:
    cards = [WorkerCard(f"w{i}", "127.0.0.1:1", ModelCard("m", "/m", block_size=BLOCK)) for i in range(WORKERS)]
    # kv as a router runs it by default: indexing the workers' KV events (no ingest: the approximate mode).
    router = build_router(lambda _m: cards, policy, ingest=KvEventIngest() if policy == "kv" else None)
    router.listeners.append(RouterMetrics(registry=CollectorRegistry(),
                                          policy_stats=router.kv.stats if router.kv is not None else None,
                                          queued=router.queue.depths, sessions=lambda: len(router.sessions),
                                          disagg_decisions=router.disagg.decisions,
                                          lora_decisions=router.lora.decisions))
    return router


def one_round(requests: int, prompt_tokens: int, policy: str) -> dict[str, float]:
    """CPU µs per request of each part, for ``requests`` fresh requests on a fresh replica."""
    events = requests_events(requests, prompt_tokens)
    router = replica(policy)
    t0 = time.process_time()
    wire = [orjson.dumps([e.to_wire("r0") for e in req]) for req in events]
    t1 = time.process_time()
    decoded = [LifecycleEvent.from_wire(d) for m in wire for d in orjson.loads(m)]
    t2 = time.process_time()
    for e in decoded:
        router.apply(e, True)
    t3 = time.process_time()
    if decoded != [e for req in events for e in req]:
        raise RuntimeError("an event did not survive the wire")
    if any(router.bookings.in_flight(f"w{i}") for i in range(WORKERS)):
        raise RuntimeError("a booking was not freed")
    return {part: dt / requests * 1e6 for part, dt in (("encode", t1 - t0), ("decode", t2 - t1), ("apply", t3 - t2))}


def run(requests: int, prompt_tokens: int, policy: str, rounds: int) -> dict[str, list[float]]:
    """CPU µs per request of each part, one figure per round."""
    figures: dict[str, list[float]] = {"encode": [], "decode": [], "apply": []}
    for _ in range(rounds):
        for part, us in one_round(requests, prompt_tokens, policy).items():
            figures[part].append(us)
    return figures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.router_sync", description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--prompt-tokens", type=int, default=208, help="the book event carries its blocks' hashes")
    p.add_argument("--policy", default="round-robin", choices=("round-robin", "kv"))
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    figures = run(args.requests, args.prompt_tokens, args.policy, args.rounds)
    print(f"{args.requests} requests, {args.prompt_tokens} prompt tokens, {args.policy}, {args.rounds} rounds: "
          "CPU µs per request (median, min): " +
          ", ".join(f"{part} {statistics.median(v):.1f} ({min(v):.1f})" for part, v in figures.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
