"""free_port's reservations: a port one process handed out is not handed out by another until it is stale."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from services.launcher import plan


def test_a_reserved_port_is_nobody_elses_until_the_reservation_is_stale(tmp_path, monkeypatch):
    monkeypatch.setattr(plan, "RESERVATIONS", tmp_path)
    assert plan._reserve(12345) and not plan._reserve(12345)
    old = time.time() - plan.RESERVATION_S - 1
    os.utime(tmp_path / "12345", (old, old))
    assert plan._reserve(12345) and not plan._reserve(12345)


def test_two_processes_never_get_the_same_port():
    code = "from services.launcher.plan import free_port; print(*(free_port() for _ in range(300)))"
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
            for _ in range(2)]
    first, second = ({int(p) for p in r.stdout.split()} for r in runs)
    assert len(first) == len(second) == 300 and not first & second
