"""``grpc_server.run`` ends a stopped process even when a leftover task swallows its cancel."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.unit

STUBBORN = textwrap.dedent("""
    import asyncio
    from services.common.grpc_server import run

    async def stubborn():
        while True:  # as a NATS client reconnecting to a NATS that is gone: the cancel is swallowed
            try:
                await asyncio.sleep(0.1)
            except asyncio.CancelledError:
                pass

    async def main():
        asyncio.create_task(stubborn(), name="stubborn-reconnect")
        await asyncio.sleep(0.05)
        print("main done", flush=True)

    run(main)
    print("exited", flush=True)
""")


def test_a_task_that_swallows_its_cancel_does_not_keep_the_process_alive():
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", STUBBORN], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["main", "done", "exited"]
    assert time.monotonic() - started < 15  # asyncio.run would wait for it forever (the subprocess timeout)
    assert "stubborn-reconnect" in proc.stderr and "left behind" in proc.stderr


def test_leftover_tasks_that_honour_the_cancel_end_quietly():
    quiet = STUBBORN.replace("except asyncio.CancelledError:\n            pass", "finally:\n            pass")
    assert quiet != STUBBORN
    proc = subprocess.run([sys.executable, "-c", quiet], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["main", "done", "exited"]
    assert "left behind" not in proc.stderr
