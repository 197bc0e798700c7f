"""When a takeover sweep may skip listing its bucket (services/gateway/lease_sweep.py)."""

from __future__ import annotations

import pytest

from services.gateway.lease_sweep import RECHECK_S, QuietSweep

pytestmark = pytest.mark.unit


def test_the_first_sweep_lists_then_only_a_write_or_a_lease_running_out_makes_it_list_again():
    quiet = QuietSweep()
    assert quiet.needed(sequence=0, now=100.0)  # never listed
    quiet.listed(7, running_leases=[130.0, 110.0])
    assert not quiet.needed(7, 109.9)  # nothing written, no lease ran out: the listing would find nothing new
    assert quiet.needed(8, 101.0)  # written since (a new batch, a renewal, a takeover elsewhere)
    assert quiet.needed(7, 110.0)  # the earliest lease it saw ran out: that record may be taken over now


def test_with_no_active_record_only_a_write_makes_it_list_again():
    quiet = QuietSweep()
    quiet.listed(3, running_leases=[])
    assert not quiet.needed(3, 1e12)
    assert quiet.needed(4, 0.0)


def test_a_sweep_sleeps_until_the_earliest_lease_it_saw_runs_out_at_most_the_recheck():
    quiet = QuietSweep()
    assert quiet.quiet_for(100.0) == 0.0  # never listed: list at once
    quiet.listed(7, running_leases=[110.0, 130.0])
    assert quiet.quiet_for(100.0) == 10.0
    assert quiet.quiet_for(111.0) == 0.0  # past due: check now
    quiet.listed(8, running_leases=[])
    assert quiet.quiet_for(100.0) == RECHECK_S  # nothing running: only a write (or the recheck) wakes it
