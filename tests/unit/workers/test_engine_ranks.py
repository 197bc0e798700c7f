"""services/workers/engine_ranks.py: the port run SGLang's per-rank publishers bind, and the per-rank in-flight
counts that keep an idle rank's stale scheduler numbers out of the routers' load (the engines' own publishers and
the per-rank subscriptions are exercised in tests/engine_env/{vllm,sglang}/test_*_dp_ranks.py)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from services.workers.engine_ranks import RankInFlight, RankSource, free_port_run, ranked_kv_events


def test_a_port_run_is_free_and_below_the_ephemeral_range():
    base = free_port_run(4, rng=random.Random(7))
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert base >= 10_000 and base + 4 <= low
    held = []
    try:
        for port in range(base, base + 4):  # each one binds: the engine's schedulers will
            s = socket.socket()
            s.bind(("127.0.0.1", port))
            held.append(s)
    finally:
        for s in held:
            s.close()


def test_a_taken_port_is_never_part_of_a_run():
    first = free_port_run(2, rng=random.Random(11))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first + 1))
        again = free_port_run(2, rng=random.Random(11))  # the same first guess, now half taken
    assert again != first and first + 1 not in (again, again + 1)


def test_a_rank_is_idle_only_while_nothing_runs_on_it_or_unplaced():
    flight = RankInFlight()
    assert flight.idle(0) and flight.idle(1) and flight.idle()
    with flight.running(1):
        assert not flight.idle(1) and flight.idle(0) and not flight.idle()
    assert flight.idle(1)
    flight.add(None)  # sent without a rank: the engine placed it somewhere
    assert not flight.idle(0) and not flight.idle(1) and flight.total == 1
    flight.remove(None)
    assert flight.idle(0) and flight.total == 0


def test_an_unregistered_worker_subscribes_to_no_rank():
    sources = [RankSource(0, "tcp://127.0.0.1:1", None), RankSource(1, "tcp://127.0.0.1:2", None)]
    asked = []

    def listener(rank):
        asked.append(rank)
        return None

    assert ranked_kv_events(sources, 16, lambda: (lambda payload: []), listener) == []
    assert asked == [0, 1]
