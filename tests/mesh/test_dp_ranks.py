"""Data-parallel ranks on a live mesh: one mocker with ``--dp-size 2`` (two simulated engines, two KV caches, two
KV event streams behind one worker) in kv mode. Each rank is routed to and indexed on its own; a repeated prompt
goes back to the rank whose cache holds it and is counted there; a rank pin (nvext.dp_rank, x-dp-rank) runs the
request on that rank; a rank the worker lacks is a 400 naming what the client sent."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.conftest import sdk_client, stop_cleanly
from tests.mesh.conftest import DEMO, mocker, start_mesh, wait_until
from tests.mesh.test_metrics import parse, value

pytestmark = pytest.mark.mesh

WORKER = "dp-w"


@pytest.fixture(scope="module")
def dp_mesh(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    m = start_mesh(tmp_path_factory, [mocker(demo_model_dir, DEMO, "200", "--dp-size", "2", "--worker-id", WORKER)],
                   router_mode="kv", inproc=True)
    yield m
    stop_cleanly(m)


@pytest.fixture
def client(dp_mesh):
    c = sdk_client(dp_mesh, timeout=30)
    yield c
    c.close()


def prompt(i: int) -> list[dict]:
    return [{"role": "user", "content": f"case {i}: " + " ".join(f"w{(i * 37 + k) % 911}" for k in range(120))}]


def routed(client: openai.OpenAI, messages: list[dict], headers: dict | None = None, **nvext) -> tuple[dict, int]:
    """The router's decision record (nvext.routing) and the cached prompt tokens the worker reported."""
    r = client.chat.completions.create(model=DEMO, messages=messages, max_tokens=2, extra_headers=headers or {},
                                       extra_body={"nvext": {"extra_fields": ["routing"], **nvext}})
    cached = r.usage.prompt_tokens_details.cached_tokens if r.usage.prompt_tokens_details else 0
    return r.model_extra["nvext"]["routing"], cached or 0


def test_each_rank_is_a_candidate_and_a_rank_pin_runs_there(client):
    record, _ = routed(client, prompt(99))
    assert sorted((c["worker_id"], c["dp_rank"]) for c in record["candidates"]) == [(WORKER, 0), (WORKER, 1)]
    for rank in (0, 1):
        record, _ = routed(client, prompt(100 + rank), dp_rank=rank)
        assert (record["worker_id"], record["dp_rank"]) == (WORKER, rank)
        assert [c["dp_rank"] for c in record["candidates"]] == [rank]  # the pin leaves that rank alone
    record, _ = routed(client, prompt(102), headers={"x-dp-rank": "1"}, dp_rank=0)  # the header wins
    assert record["dp_rank"] == 1


def kv_hits(mesh, rank: int) -> float:
    """The router's KV hits counted on one rank (the all-in-one process serves the router's families)."""
    text = httpx.get(f"http://127.0.0.1:{mesh.plan.metrics_ports['gateway-0']}/metrics", timeout=5).text
    return value(parse(text), "meshfront_router_worker_cached_tokens", "_total", worker=WORKER, dp_rank=str(rank))


def test_a_repeated_prompt_hits_the_cache_of_the_rank_that_holds_it(dp_mesh, client):
    hits = kv_hits(dp_mesh, 1)
    first, _ = routed(client, prompt(7), dp_rank=1)
    assert first["dp_rank"] == 1

    def hit():  # once rank 1's KV events reached the router, an unpinned repeat goes back there and hits its cache
        record, cached = routed(client, prompt(7))
        return (record, cached) if record["dp_rank"] == 1 and cached > 0 else None

    record, cached = wait_until(hit, 10, "the repeated prompt routed to rank 1's cache")
    by_rank = {c["dp_rank"]: c["overlap_blocks"] for c in record["candidates"]}
    assert by_rank[1] > 0 and by_rank[0] == 0  # the index knows rank 1 holds it, and rank 0 does not
    assert record["actual_cached_tokens"] == cached and record["predicted_cached_tokens"] > 0
    assert kv_hits(dp_mesh, 1) >= hits + cached  # counted on rank 1
    # The worker ran it on the rank it was sent to: rank 0's own cache does not hold the prompt.
    _, cached_on_0 = routed(client, prompt(7), dp_rank=0)
    assert cached_on_0 == 0


@pytest.mark.parametrize(("nvext", "headers", "param"), [
    ({"dp_rank": 2}, {}, "nvext.dp_rank"),
    ({}, {"x-dp-rank": "5"}, "x-dp-rank"),
    ({"backend_instance_id": WORKER, "dp_rank": 3}, {}, "nvext.dp_rank"),
])
def test_a_rank_the_worker_lacks_is_a_400_naming_what_the_client_sent(client, nvext, headers, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=DEMO, messages=prompt(1), max_tokens=2, extra_headers=headers,
                                       extra_body={"nvext": nvext})
    assert e.value.body["param"] == param and "data-parallel rank" in e.value.body["message"]
