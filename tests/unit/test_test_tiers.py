"""`make test`'s tier runner (tools/test_tiers.py): order, places kept, what a failed need means, the exit code."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.unit

_spec = importlib.util.spec_from_file_location("test_tiers_tool", ROOT / "tools" / "test_tiers.py")
assert _spec is not None and _spec.loader is not None
tiers = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = tiers  # its dataclasses look their module up
_spec.loader.exec_module(tiers)


def tier(name: str, code: str, **kw) -> tiers.Tier:
    return tiers.Tier(name, [sys.executable, "-c", code], pytest=False, **kw)


def test_a_tier_runs_after_what_it_needs_and_not_at_all_when_that_failed(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tiers, "LOGS", tmp_path)
    plan = [tier("env", "import time; time.sleep(0.3)", takes_slot=False),
            tier("broken", "raise SystemExit(3)", takes_slot=False),
            tier("uses-env", "print('ran')", needs=("env",)),
            tier("uses-broken", "print('ran')", needs=("broken",)),
            tier("alone", "print('ran')"),
            # A busy child of the tier: its CPU counts to the tier (the mesh's processes are a pytest's children).
            tier("spins", "import subprocess, sys; subprocess.run([sys.executable, '-c', "
                          "'import time; t = time.process_time()\\nwhile time.process_time() - t < 0.3: pass'])")]
    assert tiers.Runner(plan, jobs=1, pytest_args=[]).run() == 1
    by = {t.name: t for t in plan}
    assert by["uses-env"].returncode == 0 and by["uses-env"].started >= by["env"].ended
    assert by["broken"].returncode == 3 and by["uses-broken"].returncode == tiers.NOT_RUN
    assert (tmp_path / "uses-env.log").read_text() == "ran\n"
    report = capsys.readouterr().out
    assert "FAILED (exit 3)" in report and "uses-broken: not run (broken failed)" in report
    assert by["spins"].cpu_s >= 0.3 > by["env"].cpu_s
    assert "cores" in report.splitlines()[-1] and "% busy" in report.splitlines()[-1]


def test_a_waiting_tier_keeps_its_place_and_jobs_bound_the_tiers_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(tiers, "LOGS", tmp_path)
    plan = [tier("env", "import time; time.sleep(0.5)", takes_slot=False),
            tier("first", "pass", needs=("env",)),
            tier("second", "import time; time.sleep(0.2)"),
            tier("third", "import time; time.sleep(0.2)")]
    assert tiers.Runner(plan, jobs=1, pytest_args=[]).run() == 0
    first, second, third = plan[1:]
    # "first" waited for its environment in its place: "second" did not take the only slot meanwhile.
    assert second.started >= first.ended and third.started >= second.ended
