"""`meshfront run --routers 2` (the product path): two router replicas sharing their bookings over NATS.

The launcher runs as a subprocess on free ports with kv routing. The openai SDK's chats answer; one replica
SIGKILLed under a streamed load fails no stream, a fresh request is answered at once by the other replica
(no stage restart to wait for), the launcher restarts the dead one, and SIGINT leaves no process behind.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time

import openai
import pytest

from tests.mesh.conftest import DEMO
from tests.mesh.test_launcher_supervision import SPEEDUP, STREAMS, Launcher, failed, load_with_kill

pytestmark = [pytest.mark.mesh, pytest.mark.timeout(240)]


def test_two_routers_serve_and_one_killed_under_load_fails_nothing(tmp_path, demo_model_dir, envoy_bin, nats_bin):
    lch = Launcher(tmp_path, "--routers", "2", "--router-mode", "kv", "--model-dir", str(demo_model_dir),
                   "--model-name", DEMO, "--mocker-script", "", "--speedup-ratio", SPEEDUP, "--embedding-workers", "0",
                   "--image-workers", "0", "--video-workers", "0")
    try:
        lch.wait_healthy(2, 120)
        assert {"router", "router-1"} <= lch.pids().keys(), lch.log()[-4000:]
        client = openai.OpenAI(base_url=f"{lch.url}/v1", api_key="unused", max_retries=0, timeout=30)
        for i in range(6):  # the gateway spreads its Route calls over both replicas
            r = client.chat.completions.create(model=DEMO, max_tokens=4,
                                               messages=[{"role": "user", "content": f"Say hi, {i}"}])
            assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 4
        old_pid = lch.pids()["router-1"]
        results, recovered = asyncio.run(load_with_kill(lch, "router-1"))
        failures = [r for r in results if failed(r)]
        assert not failures, failures[:3]
        assert len(results) == STREAMS
        # The other replica answers at once (2.4 s once with CI's two cores running every tier, hence the
        # margin); a lone router's death costs a restart (test_launcher_supervision).
        assert recovered < 4.0, f"a fresh request was answered only {recovered:.2f} s after the kill"
        assert re.search(r"router-1 ended with signal 9 \(SIGKILL\)", lch.log()), lch.log()[-4000:]
        deadline = time.monotonic() + 30
        while lch.pids()["router-1"] == old_pid and time.monotonic() < deadline:
            time.sleep(0.1)
        assert lch.pids()["router-1"] != old_pid, "router-1 was not restarted"
        lch.wait_healthy(2, 60)
        lch.proc.send_signal(signal.SIGINT)
        assert lch.proc.wait(60) == 0, lch.log()[-4000:]
        assert lch.survivors() == [] and "every process stopped" in lch.log()
    finally:
        lch.kill_everything()
