"""KV-aware routing in a real mesh: mocker events feed the router's index, repeated prefixes hit the
cache, and workers that leave or join keep the index right (read from the router's metrics)."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
import urllib.request

import pytest

from services.launcher.plan import ProcessSpec, free_port
from tests.conftest import stop_cleanly
from tests.mesh.conftest import DEMO, mocker, start_mesh, wait_until

pytestmark = [pytest.mark.mesh, pytest.mark.timeout(120)]

PREFIX = " ".join(["river garden apple stone light bread music window"] * 40)  # 320 words


@pytest.fixture(scope="module")
def kv_mesh(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    metrics_port = free_port()
    old = os.environ.get("MESHFRONT_ROUTER_METRICS_PORT")
    os.environ["MESHFRONT_ROUTER_METRICS_PORT"] = str(metrics_port)
    try:
        m = start_mesh(tmp_path_factory, [mocker(demo_model_dir, DEMO), mocker(demo_model_dir, DEMO)],
                       router_mode="kv")
    finally:
        if old is None:
            os.environ.pop("MESHFRONT_ROUTER_METRICS_PORT")
        else:
            os.environ["MESHFRONT_ROUTER_METRICS_PORT"] = old
    # The plan may give the router its own --metrics-port (which wins over the env twin).
    m.metrics_port = m.plan.metrics_ports.get("router", metrics_port)
    yield m
    stop_cleanly(m)


def metrics(mesh) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{mesh.metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(meshfront_router_\w+(?:\{[^}]*\})?) ([0-9.e+-]+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def index_blocks(mesh) -> dict[str, float]:
    return {re.search(r'worker="([^"]+)"', k).group(1): v for k, v in metrics(mesh).items()
            if k.startswith("meshfront_router_kv_index_blocks{")}


def ask(client, tail: str):
    return client.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": f"{PREFIX} {tail}"}],
                                          max_tokens=4)


def test_repeated_prefix_hits_the_cache_and_workers_come_and_go(kv_mesh, demo_model_dir):
    import openai

    client = openai.OpenAI(base_url=f"{kv_mesh.url}/v1", api_key="unused", max_retries=0, timeout=30)
    first = ask(client, "one")
    assert first.usage.prompt_tokens > 320
    # The first request's blocks reach the router's index through the worker's KV events.
    blocks = wait_until(lambda: {w: n for w, n in index_blocks(kv_mesh).items() if n >= 20}, 5, "stored events")
    assert len(blocks) == 1
    for tail in ("two", "three", "four"):
        time.sleep(0.3)  # the previous request's Release reaches the router with this Route at the latest
        r = ask(client, tail)
        assert r.usage.prompt_tokens_details.cached_tokens >= 320, r.usage
    # First-token reports ride on the next Route or follow within 20 ms (services/gateway/releases.py).
    m = wait_until(lambda: (lambda d: d if d.get("meshfront_router_actual_cached_tokens_total", 0) >= 3 * 320
                            else None)(metrics(kv_mesh)), 5, "first-token reports")
    assert m["meshfront_router_reported_prompt_tokens_total"] > 0
    assert m["meshfront_router_predicted_cached_tokens_total"] >= 3 * 320
    assert m["meshfront_router_kv_event_gaps_total"] == 0

    # The worker holding the prefix leaves: the router drops its blocks and keeps serving.
    holder = next(iter(blocks))
    victim = next(n for n in kv_mesh.procs if f"registering {holder} " in kv_mesh.logs(n))
    kv_mesh.kill(victim, signal.SIGTERM)
    kv_mesh.procs[victim].wait(15)
    wait_until(lambda: index_blocks(kv_mesh).get(holder, 0) == 0, 10, "the index to drop the worker")
    assert ask(client, "five").usage.prompt_tokens > 320

    # A new worker joins: the router loads its state (a dump) and routes to it.
    dumps = metrics(kv_mesh)["meshfront_router_kv_dumps_loaded_total"]
    spec = mocker(demo_model_dir, DEMO)
    port = free_port()
    argv = [sys.executable, "-m", "services.workers.mocker", "--port", str(port), "--model-dir", spec.model_dir,
            "--model-name", DEMO, "--nats-url", kv_mesh.plan.nats_url, "--log-level", "INFO", *spec.extra]
    kv_mesh.start_process(ProcessSpec("mocker-new", argv, port, {"PYTHONUNBUFFERED": "1"}))
    wait_until(lambda: metrics(kv_mesh)["meshfront_router_kv_dumps_loaded_total"] > dumps, 20, "the new worker's dump")
    for tail in ("six", "seven", "eight", "nine"):
        assert ask(client, tail).usage.prompt_tokens > 320
    client.close()


OTHER_PREFIX = " ".join(["copper lantern meadow thunder violet harbor candle orbit"] * 40)  # 320 words


def test_the_decision_record_explains_the_choice_and_scores_its_prediction(kv_mesh):
    """nvext.extra_fields ["routing"]: each candidate's overlap, load and score, the choice, the predicted
    cached tokens and the actual ones; the router's precision and recall gauges follow the reports."""
    import openai

    client = openai.OpenAI(base_url=f"{kv_mesh.url}/v1", api_key="unused", max_retries=0, timeout=30)

    def explained(tail: str, **kw):
        return client.chat.completions.create(
            model=DEMO, messages=[{"role": "user", "content": f"{OTHER_PREFIX} {tail}"}], max_tokens=4,
            extra_body={"nvext": {"extra_fields": ["routing", "worker_id"]}}, **kw)

    plain = client.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": "hello"}], max_tokens=2)
    assert "nvext" not in (plain.model_extra or {})  # not asked: not there
    first = explained("one").model_extra["nvext"]["routing"]
    assert first["policy"] == "kv" and first["chosen_by"] == "policy"
    assert len(first["candidates"]) == 2 and all("score" in c and "active_blocks" in c for c in first["candidates"])
    assert first["predicted_cached_tokens"] < 320 and first["actual_cached_tokens"] is not None
    holder = first["worker_id"]
    wait_until(lambda: index_blocks(kv_mesh).get(holder, 0) >= 20, 5, "the first request's stored events")
    time.sleep(0.3)  # its Release reaches the router
    second = explained("two")
    record = second.model_extra["nvext"]["routing"]
    assert record["worker_id"] == holder == second.model_extra["nvext"]["worker_id"]["decode_worker_id"]
    seen = {c["worker_id"]: c for c in record["candidates"]}
    assert seen[holder]["overlap_blocks"] >= 20 and seen[holder]["score"] == min(c["score"] for c in seen.values())
    assert record["predicted_cached_tokens"] >= 320 and record["actual_cached_tokens"] >= 320
    assert record["actual_cached_tokens"] == second.usage.prompt_tokens_details.cached_tokens
    # Streamed: on the choice's last chunk, with the actual cached tokens known by then.
    chunks = list(explained("three", stream=True))
    routed = [c.model_extra["nvext"]["routing"] for c in chunks
              if (c.model_extra or {}).get("nvext", {}).get("routing")]
    assert len(routed) == 1 and routed[0]["worker_id"] == holder and routed[0]["actual_cached_tokens"] >= 320
    m = wait_until(lambda: (lambda d: d if "meshfront_router_prediction_recall" in d else None)(metrics(kv_mesh)),
                   5, "the precision and recall gauges")
    assert 0 < m["meshfront_router_prediction_precision"] <= 1 and 0 < m["meshfront_router_prediction_recall"] <= 1
    client.close()
