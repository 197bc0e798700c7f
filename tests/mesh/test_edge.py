"""The edge's documents through Envoy on the API's port: /openapi.json, /docs and its assets, /metrics.

/metrics is checked twice: on the session mesh (split shape, our names, one gateway) and on a mesh of
two all-in-one replicas with ``--metrics-prefix dynamo_frontend`` (Dynamo's names, every replica's
series whichever replica Envoy asks).
"""

from __future__ import annotations

import asyncio
import re
import socket
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.gateway.edge import swagger_ui
from services.gateway.http_api.routes import ENDPOINTS
from tests.conftest import require_module, stop_cleanly
from tests.mesh.conftest import DEMO, mocker, start_mesh

pytestmark = pytest.mark.mesh

CHAT = [{"role": "user", "content": "count to ten"}]


def get(mesh, path: str) -> httpx.Response:
    return httpx.get(f"{mesh.url}{path}", timeout=30)


def test_openapi_json_through_envoy(mesh):
    validator = require_module("openapi_spec_validator")
    r = get(mesh, "/openapi.json")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/json")
    doc = r.json()
    validator.validate(doc)
    assert {(m, p) for p, ops in doc["paths"].items() for m in ops} == {(e.method, e.path) for e in ENDPOINTS}


def test_docs_page_and_its_assets_through_envoy(mesh):
    page = get(mesh, "/docs")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "/openapi.json" in page.text
    referenced = re.findall(r'(?:src|href)="/docs/assets/([^"]+)"', page.text)
    assert {"swagger-ui-bundle.js", "swagger-ui.css"} <= set(referenced)
    for name in referenced:
        r = get(mesh, f"/docs/assets/{name}")
        assert r.status_code == 200, name
        assert r.headers["content-type"] == swagger_ui.ASSETS[name], name
        assert r.content == (swagger_ui.bundle_dir() / name).read_bytes(), name  # whole, in order (chunked)
    missing = get(mesh, "/docs/assets/..%2Fsecret")
    assert missing.status_code == 404
    assert missing.json()["error"]["param"] == "name"


def families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def total(fams, name: str, suffix: str = "", **labels) -> float:
    family = fams.get(name)
    if family is None:
        return 0.0
    return sum(s.value for s in family.samples
               if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items()))


def scrape(mesh) -> tuple[httpx.Response, dict[str, object]]:
    r = get(mesh, "/metrics")
    assert r.status_code == 200, r.text
    return r, families(r.text)


def settled(mesh, prefix: str, within_s: float = 5.0) -> dict[str, object]:
    """A scrape once nothing is in flight: a request is recorded just after its last byte went out."""
    deadline = time.monotonic() + within_s
    while True:
        _, fams = scrape(mesh)
        if total(fams, f"{prefix}inflight_requests") == 0 or time.monotonic() > deadline:
            return fams
        time.sleep(0.05)


def chats(client, streams: tuple[bool, ...]) -> tuple[int, int]:
    """Runs chat requests one by one; (prompt tokens, completion tokens) summed from their usage."""
    tokens_in = tokens_out = 0
    for stream in streams:
        if stream:
            chunks = list(client.chat.completions.create(model=DEMO, messages=CHAT, max_tokens=12, stream=True,
                                                         stream_options={"include_usage": True}))
            usage = chunks[-1].usage
        else:
            usage = client.chat.completions.create(model=DEMO, messages=CHAT, max_tokens=12).usage
        tokens_in += usage.prompt_tokens
        tokens_out += usage.completion_tokens
    return tokens_in, tokens_out


def test_metrics_through_envoy_count_requests(mesh, client):
    _, before = scrape(mesh)
    streams = (False, True, True, False, True)
    tokens_in, tokens_out = chats(client, streams)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=CHAT, max_tokens=4)
    r, _ = scrape(mesh)
    assert r.headers["content-type"].startswith("text/plain")
    after = settled(mesh, "meshfront_gateway_")

    def moved(name: str, suffix: str = "", **labels) -> float:
        return total(after, name, suffix, **labels) - total(before, name, suffix, **labels)

    p = "meshfront_gateway_"
    assert moved(f"{p}requests", "_total", model=DEMO, endpoint="chat", status="200") == len(streams)
    # A refused request's model stays "": client-chosen names must not mint series.
    assert moved(f"{p}requests", "_total", model="", endpoint="chat", status="404") == 1
    assert moved(f"{p}errors", "_total", model="", reason="NOT_FOUND") == 1
    assert moved(f"{p}time_to_first_token_seconds", "_count", model=DEMO) == sum(streams)
    assert moved(f"{p}inter_token_latency_seconds", "_count", model=DEMO) == sum(streams)
    assert moved(f"{p}request_duration_seconds", "_count", model=DEMO) == len(streams)
    assert moved(f"{p}input_tokens", "_total", model=DEMO) == tokens_in
    assert moved(f"{p}output_tokens", "_total", model=DEMO) == tokens_out
    assert moved(f"{p}input_sequence_tokens", "_sum", model=DEMO) == tokens_in
    assert moved(f"{p}output_sequence_tokens", "_count", model=DEMO) == len(streams)
    assert 0 < moved(f"{p}request_duration_seconds", "_sum", model=DEMO) < 60
    assert total(after, f"{p}inflight_requests", model=DEMO) == 0
    # Every series names its replica: the session mesh has one gateway.
    replicas = {s.labels["gateway"] for f in after.values() for s in f.samples}
    assert replicas == {f"{socket.gethostname()}:{port}" for port in mesh.plan.gateway_ports}
    assert not any(name.startswith("dynamo_") for name in after)


@pytest.fixture(scope="module")
def dynamo_mesh(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    """Two all-in-one gateway replicas behind Envoy, with Dynamo's metric names (the session mesh covers
    the split shape and our names)."""
    m = start_mesh(tmp_path_factory, [mocker(demo_model_dir, DEMO, "20")], gateways=2, inproc=True,
                   service_args={"gateway": ("--metrics-prefix", "dynamo_frontend")})
    yield m
    stop_cleanly(m)


async def _concurrent_streams(mesh, count: int) -> int:
    """``count`` streams at once, so Envoy's least-request balancing gives both replicas some."""
    client = openai.AsyncOpenAI(base_url=f"{mesh.url}/v1", api_key="unused", max_retries=0, timeout=60)

    async def one() -> int:
        stream = await client.chat.completions.create(model=DEMO, messages=CHAT, max_tokens=40, stream=True,
                                                      stream_options={"include_usage": True})
        usage = None
        async for chunk in stream:
            usage = chunk.usage or usage
        assert usage is not None
        return usage.completion_tokens

    try:
        return sum(await asyncio.gather(*(one() for _ in range(count))))
    finally:
        await client.close()


def test_dynamo_names_from_every_replica(dynamo_mesh):
    p = "dynamo_frontend_"
    replicas = {f"{socket.gethostname()}:{port}" for port in dynamo_mesh.plan.gateway_ports}
    # Batches of concurrent streams until both replicas served some (Envoy balances only over gateways
    # whose health checks passed, and least-request needs streams in flight to spread them).
    count = tokens_out = 0
    deadline = time.monotonic() + 60
    while True:
        tokens_out += asyncio.run(_concurrent_streams(dynamo_mesh, 8))
        count += 8
        fams = settled(dynamo_mesh, p)
        if {s.labels["gateway"] for s in fams[f"{p}requests"].samples} == replicas:
            break
        assert time.monotonic() < deadline, "Envoy never spread streams over both gateways"
    # Whichever replica Envoy asks, the body holds both replicas' series: the totals never move between scrapes.
    totals = []
    for _ in range(6):
        _, fams = scrape(dynamo_mesh)
        assert not any(name.startswith("meshfront_") for name in fams)
        ok = total(fams, f"{p}requests", "_total", model=DEMO, endpoint="chat_completions", request_type="stream",
                   status="success", error_type="")
        seen = {s.labels["gateway"] for s in fams[f"{p}requests"].samples}
        totals.append((ok, total(fams, f"{p}time_to_first_token_seconds", "_count", model=DEMO),
                       total(fams, f"{p}output_tokens", "_total", model=DEMO),
                       total(fams, f"{p}output_sequence_tokens", "_sum", model=DEMO), frozenset(seen)))
    assert set(totals) == {(count, count, tokens_out, tokens_out, frozenset(replicas))}, (count, tokens_out, totals)
    for name in ("inflight_requests", "request_duration_seconds", "input_sequence_tokens", "cached_tokens",
                 "inter_token_latency_seconds"):
        assert f"{p}{name}" in fams, name



def envoy_stat(mesh, name: str) -> int:
    stats = httpx.get(f"http://127.0.0.1:{mesh.plan.admin_port}/stats", timeout=5).text
    return int(re.search(rf"^{re.escape(name)}: (\d+)$", stats, re.M).group(1))


def test_a_killed_gateway_replica_is_retried_around_and_ejected_at_once(dynamo_mesh):
    """Runs last in this module. Until the health check notices a SIGKILLed replica (up to ~4 s), Envoy's
    balancing still picks it: a request that could not connect is retried (it never reached a gateway)
    and the replica is ejected on its first refused connection, so at most a stray request in the first
    half second fails where nearly every second one did (34 of 40 in one measured run without either)."""
    client = openai.OpenAI(base_url=f"{dynamo_mesh.url}/v1", api_key="unused", max_retries=0, timeout=30)
    dynamo_mesh.kill("gateway-1")
    dynamo_mesh.procs["gateway-1"].wait(5)
    failed = 0
    try:
        for _ in range(40):
            try:
                reply = client.chat.completions.create(model=DEMO, messages=CHAT, max_tokens=4)
                assert reply.choices[0].finish_reason == "length"
            except openai.InternalServerError:
                failed += 1
        refused = envoy_stat(dynamo_mesh, "cluster.gateway.upstream_cx_connect_fail")
        assert failed <= 3, (failed, refused)
        if refused:  # the balancer picked the dead replica at least once: it was ejected for it
            assert envoy_stat(dynamo_mesh, "cluster.gateway.outlier_detection.ejections_enforced_total") >= 1
            assert envoy_stat(dynamo_mesh, "cluster.gateway.upstream_rq_retry") >= 1
    finally:
        client.close()
        dynamo_mesh.restart("gateway-1")
