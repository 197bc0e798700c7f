"""Policy classes through the whole mesh with --auth: two tenants whose keys are in classes of weights 4 and 1
both flood one saturated worker, and the router serves them 4:1 (±20 %); the class header obeys the key.

Bounded: one mocker worker with 2 slots (--max-in-flight-per-worker 2, the rest waits in the router queue), 12
streams per tenant for 8 s. The load is bench/tenants.py's (the bench's own client, so the test also runs it).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time

import httpx
import pytest

from bench.tenants import closed_loop, served_windows
from services.gateway.scheduling import HEADER
from services.launcher.plan import VENV_BIN
from services.router.core.policy_classes import weights_yaml
from tests.conftest import stop_cleanly
from tests.mesh.conftest import DEMO, mocker, start_mesh

pytestmark = [pytest.mark.mesh, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def tmesh(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    policy = tmp_path_factory.mktemp("policy") / "policy.yaml"
    policy.write_text(weights_yaml([("premium", 4), ("standard", 1)]))
    m = start_mesh(tmp_path_factory, [mocker(demo_model_dir, DEMO, "1")],
                   service_args={"gateway": ("--auth",),
                                 "router": ("--max-in-flight-per-worker", "2", "--queue-timeout-s", "30",
                                            "--router-policy-config", str(policy))})
    yield m
    stop_cleanly(m)


def new_key(mesh, tenant: str, classes: str) -> str:
    out = subprocess.run([str(VENV_BIN / "meshfront"), "keys", "create", "--tenant", tenant, "--policy-class", classes],
                         capture_output=True, text=True, timeout=30, check=True,
                         env={**os.environ, "NATS_SERVER": mesh.plan.nats_url})
    return out.stdout.splitlines()[-1]


def test_two_flooding_tenants_of_weights_4_and_1_are_served_4_to_1(tmesh):
    premium, standard = new_key(tmesh, "gold", "premium"), new_key(tmesh, "tin", "standard")

    async def flood() -> list:
        start = time.monotonic()
        until = start + 8.0
        streams = await asyncio.gather(closed_loop(tmesh.url, premium, "gold", 12, 6, 20, until, 30),
                                       closed_loop(tmesh.url, standard, "tin", 12, 6, 20, until, 30))
        # From 1.5 s on: the first requests took the free slots in arrival order.
        return [*streams, served_windows(list(streams), start + 1.5, 6.5, until)[0]]

    gold, tin, served = asyncio.run(flood())
    assert not gold.failed and not tin.failed, (gold.results[:1], tin.results[:1])
    assert served["gold"] + served["tin"] >= 40, served  # saturated long enough to measure
    assert 3.2 <= served["gold"] / max(1, served["tin"]) <= 4.8, served


def test_the_class_header_picks_only_among_the_keys_classes(tmesh):
    both = new_key(tmesh, "flex", "standard,premium")
    body = {"model": DEMO, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}

    def post(header: str) -> httpx.Response:
        return httpx.post(f"{tmesh.url}/v1/chat/completions", json=body, timeout=30,
                          headers={"Authorization": f"Bearer {both}", HEADER: header})

    assert post("premium").status_code == 200
    refused = post("platinum")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "policy_class_not_allowed"
    assert "only standard, premium" in refused.json()["error"]["message"]
