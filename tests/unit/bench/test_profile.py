"""bench/profile.py: collapsed py-spy stacks into self and inclusive shares, and the per-hop message counts."""

from __future__ import annotations

import pytest

from bench.mesh import chunks_per_message
from bench.profile import Profile

pytestmark = pytest.mark.unit

STACKS = """\
<module> (b/__main__.py:7);run (a/runners.py:118);_generate (s/server.py:120);sse (s/responses.py:230) 30
<module> (b/__main__.py:7);run (a/runners.py:118);_generate (s/server.py:126) 10
<module> (b/__main__.py:7);run (a/runners.py:118) 40
_bootstrap (threading.py:995);run (threading.py:975) 20
not a stack line
"""


def test_self_and_inclusive_shares_add_up_by_function_not_line():
    p = Profile.parse(STACKS)
    assert p.samples == 100
    assert p.self_counts["sse (responses.py)"] == 30
    assert p.self_counts["_generate (server.py)"] == 10  # two lines of one function are one entry
    assert p.inclusive_counts["_generate (server.py)"] == 40
    assert p.inclusive_counts["run (threading.py)"] == 20


def test_the_summary_leaves_out_the_frames_every_main_stack_has():
    lines = Profile.parse(STACKS).summary(top=5)
    inclusive = lines[lines.index("  inclusive (below the event loop):") + 1:]
    assert any("_generate (server.py)" in line and "40.0 %" in line for line in inclusive)
    assert not any("<module>" in line or "run (runners.py)" in line for line in inclusive)


def test_chunks_per_message_is_the_change_over_the_level():
    before = {"worker.GenerateStream": (100.0, 400.0)}
    after = {"worker.GenerateStream": (110.0, 1000.0), "postprocessor.GenerateStream": (5.0, 50.0)}
    assert chunks_per_message(before, after) == {"worker.GenerateStream": 60.0, "postprocessor.GenerateStream": 10.0}
    assert chunks_per_message(after, after) == {}  # nothing sent during the level: no figure, not a division by 0
