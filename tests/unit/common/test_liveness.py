"""Each discovery reader's own liveness rules (services/common/liveness.py), on a fake clock."""

from __future__ import annotations

import pytest

from services.common.discovery import ModelCard, WorkerCard, next_beat_in
from services.common.liveness import SILENCE_TTLS, LiveWorkers

pytestmark = pytest.mark.unit

TTL = 6.0
NOW = 1_000_000.0  # epoch seconds of the reader's wall clock


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def live(clock):
    return LiveWorkers(TTL, clock=clock, wall=lambda: NOW + clock.t)


def card(worker_id: str, port: int, model: str = "m") -> WorkerCard:
    return WorkerCard(worker_id=worker_id, address=f"10.0.0.1:{port}", model=ModelCard(name=model, model_dir="/m"))


def test_a_stale_registration_a_new_watch_hands_over_is_ignored(live):
    assert live.heard("dead", card("dead", 1), NOW - TTL - 1, handed_over=True) == []
    assert live.cards() == {}


def test_a_fresh_one_is_taken(live):
    c = card("w", 1)
    assert live.heard("w", c, NOW - 2, handed_over=True) == [("w", c)]
    assert live.cards() == {"w": c}


def test_a_heartbeat_on_a_running_watch_counts_whatever_the_clocks_say(live):
    c = card("w", 1)
    assert live.heard("w", c, NOW - 100, handed_over=False) == [("w", c)]


def test_a_known_worker_is_kept_when_a_new_watch_hands_over_its_old_heartbeat(live):
    c = card("w", 1)
    live.heard("w", c, NOW, handed_over=False)
    assert live.heard("w", c, NOW - 20, handed_over=True) == []  # no change to report
    assert live.cards() == {"w": c}


def test_the_same_card_again_reports_no_change_but_a_new_card_does(live):
    live.heard("w", card("w", 1), NOW, handed_over=False)
    assert live.heard("w", card("w", 1), NOW + 2, handed_over=False) == []
    moved = card("w", 1, model="other")
    assert live.heard("w", moved, NOW + 4, handed_over=False) == [("w", moved)]


def test_a_worker_silent_for_two_ttls_leaves_and_a_heartbeat_resets_its_silence(live, clock):
    live.heard("w", card("w", 1), NOW, handed_over=False)
    clock.t = SILENCE_TTLS * TTL - 0.5
    assert live.expire() == []
    live.heard("w", card("w", 1), NOW + clock.t, handed_over=False)
    clock.t += SILENCE_TTLS * TTL - 0.5
    assert live.expire() == []
    clock.t += 1.0
    assert live.expire() == [("w", None)]
    assert live.cards() == {}


def test_restarting_silence_keeps_workers_nobody_could_hear(live, clock):
    live.heard("w", card("w", 1), NOW, handed_over=False)
    clock.t = 100.0  # NATS was away
    live.restart_silence()
    clock.t += SILENCE_TTLS * TTL - 0.5
    assert live.expire() == []


def test_a_new_id_on_a_known_address_replaces_the_old_one(live):
    old, new = card("old", 7), card("new", 7)
    live.heard("old", old, NOW, handed_over=False)
    assert live.heard("new", new, NOW + 1, handed_over=False) == [("old", None), ("new", new)]
    assert live.cards() == {"new": new}


def test_an_id_whose_address_was_registered_later_by_another_is_ignored(live):
    new = card("new", 7)
    live.heard("new", new, NOW, handed_over=True)
    assert live.heard("old", card("old", 7), NOW - 1, handed_over=True) == []
    assert live.cards() == {"new": new}


def test_other_addresses_are_left_alone(live):
    a, b = card("a", 7), card("b", 8)
    live.heard("a", a, NOW, handed_over=False)
    live.heard("b", b, NOW + 1, handed_over=False)
    assert live.cards() == {"a": a, "b": b}


def test_left_reports_only_workers_it_knew(live):
    live.heard("w", card("w", 1), NOW, handed_over=False)
    assert live.left("w") == [("w", None)]
    assert live.left("w") == []


def test_heartbeats_go_out_at_the_same_wall_clock_moments_and_never_more_than_a_period_apart():
    assert next_beat_in(2.0, 100.5) == 1.5
    assert next_beat_in(2.0, 101.999) == pytest.approx(0.001)
    assert next_beat_in(2.0, 102.0) == 2.0  # on the beat: the next one, a full period later
    # Two workers that registered at different moments renew together from their second beat on.
    assert 100.5 + next_beat_in(2.0, 100.5) == 101.2 + next_beat_in(2.0, 101.2) == 102.0
