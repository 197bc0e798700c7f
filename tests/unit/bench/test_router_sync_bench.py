"""bench/router_sync.py: it times the product's encode, decode and apply, and every event survives the wire."""

from __future__ import annotations

import pytest

from bench.router_sync import run

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("policy", ["round-robin", "kv"])
def test_times_each_part_of_a_peer_request_and_frees_every_booking(policy):
    # run() raises when a decoded event differs from the one sent or a booking is left in flight.
    figures = run(requests=20, prompt_tokens=64, policy=policy, rounds=2)
    assert set(figures) == {"encode", "decode", "apply"}
    assert all(len(v) == 2 and all(f > 0 for f in v) for v in figures.values())
