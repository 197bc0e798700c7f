"""Two meshes on one NATS, in namespaces of their own, see none of each other's workers, events or objects.

Mesh ``alpha`` (split: every stage its own process) starts NATS; mesh ``beta`` (all-in-one) joins it
(``external_nats_url``). Both serve the demo model under the same name and route by KV events, so a leak
would show: a request landing on the other mesh's worker, the other mesh's workers in a router's KV index,
a stored response readable through the other gateway. services/common/namespace.py has the naming.
"""

from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import sdk_client, stop_cleanly
from tests.mesh.conftest import DEMO, SECOND, mocker, start_mesh, wait_until

pytestmark = [pytest.mark.mesh, pytest.mark.timeout(180)]

PROMPT = "Tell me about the weather on the coast of Brittany in autumn, in some detail please. " * 4


@pytest.fixture(scope="module")
def meshes(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    alpha = start_mesh(tmp_path_factory, [mocker(demo_model_dir, DEMO, "200", "--worker-id", "alpha-w0")],
                       namespace="alpha", router_mode="kv")
    try:
        beta = start_mesh(tmp_path_factory, [mocker(demo_model_dir, DEMO, "200", "--worker-id", "beta-w0"),
                                             mocker(demo_model_dir, SECOND, "200", "--worker-id", "beta-w1")],
                          namespace="beta", router_mode="kv", inproc=True, external_nats_url=alpha.plan.nats_url)
    except BaseException:
        stop_cleanly(alpha)
        raise
    yield alpha, beta
    stop_cleanly(beta)  # first: it uses alpha's NATS
    stop_cleanly(alpha)


def _models(mesh) -> set[str]:
    return {m["id"] for m in httpx.get(f"{mesh.url}/v1/models", timeout=5).json()["data"]}


def _served_by(mesh, **nvext) -> tuple[int, str]:
    """(status, the worker that answered) of one chat request through ``mesh``'s edge."""
    r = httpx.post(f"{mesh.url}/v1/chat/completions", timeout=30, json={
        "model": DEMO, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4,
        "nvext": {"extra_fields": ["worker_id"], **nvext}})
    return r.status_code, (r.json()["nvext"]["worker_id"]["decode_worker_id"] if r.status_code == 200 else r.text)


def _indexed_workers(mesh, process: str) -> dict[str, float]:
    """Blocks per worker in the KV index of the router in ``process`` (its /metrics)."""
    text = httpx.get(f"http://127.0.0.1:{mesh.plan.metrics_ports[process]}/metrics", timeout=5).text
    return {s.labels["worker"]: s.value for f in text_string_to_metric_families(text)
            if f.name == "meshfront_router_kv_index_blocks" for s in f.samples}


def test_each_gateway_lists_and_routes_to_its_own_workers_only(meshes):
    alpha, beta = meshes
    assert _models(alpha) == {DEMO}
    assert _models(beta) == {DEMO, SECOND}
    for _ in range(3):
        assert _served_by(alpha) == (200, "alpha-w0")
        assert _served_by(beta) == (200, "beta-w0")
    # The other mesh's worker is unknown here, even by name: a pin to it is refused, never followed.
    status, body = _served_by(alpha, decode_worker_id="beta-w0")
    assert status == 400 and "names worker beta-w0, which does not serve" in body, (status, body)
    r = httpx.post(f"{alpha.url}/v1/chat/completions", timeout=10,
                   json={"model": SECOND, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text


def test_each_router_indexes_the_kv_events_of_its_own_workers_only(meshes):
    alpha, beta = meshes
    for mesh in meshes:  # cached blocks on every worker of both meshes
        assert _served_by(mesh)[0] == 200
    # The index fills from the workers' events (the router's own bookings do not count in kv mode).
    assert wait_until(lambda: _indexed_workers(alpha, "router").get("alpha-w0"), 10, "alpha's KV events")
    assert wait_until(lambda: _indexed_workers(beta, "gateway-0").get("beta-w0"), 10, "beta's KV events")
    assert set(_indexed_workers(alpha, "router")) == {"alpha-w0"}
    assert set(_indexed_workers(beta, "gateway-0")) <= {"beta-w0", "beta-w1"}


def test_a_stored_response_is_the_storing_meshs_alone(meshes):
    alpha, beta = meshes
    with sdk_client(alpha) as a, sdk_client(beta) as b:
        stored = a.responses.create(model=DEMO, input="Say hello", max_output_tokens=4)
        assert a.responses.retrieve(stored.id).id == stored.id
        with pytest.raises(openai.NotFoundError):
            b.responses.retrieve(stored.id)
