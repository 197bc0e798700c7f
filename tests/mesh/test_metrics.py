"""Prometheus metrics of every service of the session mesh, checked against docs/metrics.md.

The launcher's test plans give every process a ``--metrics-port`` (``MeshPlan.metrics_ports``).
The documented tables are parsed, so a metric documented but not exported, exported but not
documented, or documented with another type fails here. Counters are compared before and after a
few requests (other tests share the mesh, so movements are lower bounds).
"""

from __future__ import annotations

import re
import time

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.launcher.plan import ROOT
from tests.conftest import stop_cleanly
from tests.mesh.conftest import DEMO, mocker, start_mesh, wait_until

pytestmark = pytest.mark.mesh

DOC = ROOT / "docs" / "metrics.md"
# docs/metrics.md's section prefix -> the process names (services/launcher/plan.py) that export it.
PROCESSES = {"meshfront_gateway_": ("gateway-",), "meshfront_preprocessor_": ("preprocessor",),
             "meshfront_router_": ("router",), "meshfront_postprocessor_": ("postprocessor",),
             "meshfront_worker_": ("mocker-",), "meshfront_mux_": ("mocker-", "postprocessor"),
             "meshfront_gc_": ("",)}  # every process
KV_ONLY = "*kv mode*"
# Exported only by embedding workers (the session mesh runs mockers; tests/mesh/test_embeddings.py
# scrapes an embedding worker): optional here, like the kv-mode names.
EMBED_ONLY = "*embed workers*"


def documented(naming: str = "meshfront_") -> dict[str, dict[str, tuple[str, bool]]]:
    """prefix -> {family name: (type, kv mode only)} from the doc's tables whose prefix starts with
    ``naming``; counters lose ``_total``. Other sections' rows belong to no table."""
    out: dict[str, dict[str, tuple[str, bool]]] = {}
    prefix = None
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            heading = re.match(r"## .*\(`(\w+_)`\)", line)
            prefix = heading.group(1) if heading and heading.group(1).startswith(naming) else None
            if prefix:
                out[prefix] = {}
            continue
        row = re.match(r"\| `(\w+)` \| (\w+) \|[^|]*\|(.*)\|$", line)
        if row and prefix:
            name, kind, meaning = row.groups()
            if kind == "counter":
                name = name.removesuffix("_total")
            out[prefix][prefix + name] = (kind, KV_ONLY in meaning or EMBED_ONLY in meaning)
    return out


def parse(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text) if not f.name.endswith("_created")}


def scrape(mesh) -> dict[str, dict[str, object]]:
    with httpx.Client(timeout=5) as http:
        return {name: parse(http.get(f"http://127.0.0.1:{port}/metrics").text)
                for name, port in mesh.plan.metrics_ports.items()}


def value(families, name: str, suffix: str = "", **labels) -> float:
    """Sum of the samples ``name + suffix`` whose labels include ``labels``."""
    family = families.get(name)
    if family is None:
        return 0.0
    return sum(s.value for s in family.samples
               if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items()))


def processes_of(scraped, prefix: str) -> list[str]:
    return [name for name in scraped if name.startswith(PROCESSES[prefix])]  # str.startswith takes a tuple


def test_doc_tables_cover_every_service():
    assert set(documented()) == set(PROCESSES)


def test_exported_names_match_the_doc(mesh):
    docs = documented()
    scraped = scrape(mesh)
    assert set(mesh.plan.metrics_ports) == set(mesh.plan.service_names())
    for prefix, names in docs.items():
        expected = {n: kind for n, (kind, kv_only) in names.items() if not kv_only}
        for process in processes_of(scraped, prefix):
            families = scraped[process]
            exported = {n: f.type for n, f in families.items() if n.startswith(prefix)}
            optional = {n for n, (_, kv_only) in names.items() if kv_only}
            assert set(exported) - optional == set(expected), process  # neither missing nor undocumented
            assert {n: exported[n] for n in expected} == expected, process
            assert "process_resident_memory_bytes" in families, process  # as the doc promises
    for process, families in scraped.items():  # and no meshfront_ family outside its process's sections
        sections = tuple(prefix for prefix, processes in PROCESSES.items() if process.startswith(processes))
        assert [n for n in families if n.startswith("meshfront_") and not n.startswith(sections)] == [], process


def test_every_process_froze_its_start_up_heap(mesh):
    """Each service and worker froze what start-up left (services/common/gc_pauses.py) before it said READY, and
    times its collections from then on, the freeze's own full collection among them."""
    for process, families in scrape(mesh).items():
        assert value(families, "meshfront_gc_frozen_objects") > 10_000, process  # modules, descriptors, ...
        assert value(families, "meshfront_gc_pause_seconds", "_count", generation="2") >= 1, process


def test_kv_mode_router_names_match_the_doc():
    """The kv-only names without a kv mesh: the router's metrics over a kv policy and event ingest."""
    from services.router.core.kv_ingest import KvEventIngest
    from services.router.core.policies import kv_policy
    from services.router.metrics import RouterMetrics

    ingest = KvEventIngest()
    registry = CollectorRegistry()
    RouterMetrics(registry, ingest=ingest, policy_stats=kv_policy().stats)
    exported = {n: f.type for n, f in parse(generate_latest(registry).decode()).items()}
    docs = documented()["meshfront_router_"]
    assert exported == {n: kind for n, (kind, _) in docs.items()}


@pytest.mark.parametrize("prefix", ["meshfront_gateway", "dynamo_frontend"])
def test_gateway_namings_match_the_doc(prefix):
    """Both namings of the gateway's request metrics (--metrics-prefix), without a mesh."""
    from services.gateway.frontend_metrics import DynamoRecorder, MeshfrontRecorder

    recorder = MeshfrontRecorder(prefix) if prefix == "meshfront_gateway" else DynamoRecorder(prefix)
    exported = {n: f.type for n, f in parse(generate_latest(recorder.registry).decode()).items()}
    docs = documented(prefix)[f"{prefix}_"]
    assert exported == {n: kind for n, (kind, _) in docs.items()}


def test_counters_move_with_requests(mesh, client):
    before = scrape(mesh)
    tokens_in = tokens_out = 0
    for stream in (False, True, False, True):
        messages = [{"role": "user", "content": "count to ten"}]
        if stream:
            chunks = list(client.chat.completions.create(model=DEMO, messages=messages, max_tokens=12, stream=True,
                                                         stream_options={"include_usage": True}))
            usage = chunks[-1].usage
        else:
            usage = client.chat.completions.create(model=DEMO, messages=messages, max_tokens=12).usage
        tokens_in += usage.prompt_tokens
        tokens_out += usage.completion_tokens
    assert in_flight(mesh) == {}  # every service has finished its books on these requests
    after = scrape(mesh)

    def moved(prefix: str, name: str, suffix: str = "", **labels) -> float:
        return sum(value(after[p], prefix + name, suffix, **labels) - value(before[p], prefix + name, suffix, **labels)
                   for p in processes_of(after, prefix))

    gw = "meshfront_gateway_"
    assert moved(gw, "requests", "_total", model=DEMO, status="200") >= 4
    assert moved(gw, "input_tokens", "_total", model=DEMO) >= tokens_in
    assert moved(gw, "output_tokens", "_total", model=DEMO) >= tokens_out
    assert moved(gw, "time_to_first_token_seconds", "_count", model=DEMO) >= 2  # the two streams
    assert moved(gw, "request_duration_seconds", "_count", model=DEMO) >= 4
    assert moved(gw, "inter_token_latency_seconds", "_count", model=DEMO) >= 2
    assert moved("meshfront_preprocessor_", "requests", "_total", outcome="ok") >= 4
    assert moved("meshfront_preprocessor_", "duration_seconds", "_count") >= 4
    assert moved("meshfront_router_", "routed_requests", "_total") >= 4
    assert moved("meshfront_router_", "routed_prompt_tokens", "_total") >= tokens_in
    assert moved("meshfront_postprocessor_", "streams", "_total", outcome="finished") >= 4
    assert moved("meshfront_worker_", "requests", "_total", outcome="finished") >= 4
    # Per-worker load: the router's shares add up to one; nothing is left in flight.
    shares = [s.value for s in after["router"]["meshfront_router_worker_load_share"].samples]
    assert len(shares) >= 2 and sum(shares) == pytest.approx(1.0)


def in_flight(mesh, within_s: float = 3.0) -> dict[str, float]:
    """Non-zero in-flight gauges, polled briefly (a gauge drops just after the last byte is sent)."""
    gauges = (("meshfront_gateway_", "inflight_requests"), ("meshfront_postprocessor_", "inflight_streams"),
              ("meshfront_worker_", "inflight_requests"))
    deadline = time.monotonic() + within_s
    while True:
        scraped = scrape(mesh)
        busy = {f"{p} {prefix}{gauge}": value(scraped[p], prefix + gauge)
                for prefix, gauge in gauges for p in processes_of(scraped, prefix)}
        busy = {k: v for k, v in busy.items() if v}
        if not busy or time.monotonic() > deadline:
            return busy
        time.sleep(0.1)


# --- Dynamo's naming with its mesh-wide families (--metrics-prefix dynamo_frontend) ---------------------------

DYN = "dynamo_frontend_"
SESSION = {"X-Dynamo-Session-ID": "conv-1"}


@pytest.fixture(scope="module")
def dyn_mesh(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    """All-in-one, two slow workers of one request each; header sessions on, hard (Dynamo's default)."""
    m = start_mesh(tmp_path_factory, [mocker(demo_model_dir, DEMO, "1"), mocker(demo_model_dir, DEMO, "1")],
                   inproc=True, service_args={
                       "gateway": ("--metrics-prefix", "dynamo_frontend"),
                       "router": ("--max-in-flight-per-worker", "1", "--router-session-affinity-ttl-secs", "60",
                                  "--router-session-affinity-mode", "hard")})
    yield m
    stop_cleanly(m)


def edge_scrape(mesh) -> dict[str, object]:
    """The edge's /metrics: what Dynamo's Planner scrapes."""
    return parse(httpx.get(f"http://127.0.0.1:{mesh.plan.http_port}/metrics", timeout=10).text)


def chat(http: httpx.Client, mesh, text: str, max_tokens: int = 4, **body) -> httpx.Response:
    return http.post(f"http://127.0.0.1:{mesh.plan.http_port}/v1/chat/completions", headers=SESSION, json={
        "model": DEMO, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, **body})


def test_dynamo_families_follow_sessions_cancels_and_rejections(dyn_mesh):
    with httpx.Client(timeout=60) as http:
        chosen = []
        for i in range(3):  # one X-Dynamo-Session-ID: one worker, the session's from the second request on
            r = chat(http, dyn_mesh, f"turn {i}", nvext={"extra_fields": ["routing"]})
            assert r.status_code == 200, r.text
            chosen.append(r.json()["nvext"]["routing"])
        home = chosen[0]["worker_id"]
        assert [c["worker_id"] for c in chosen] == [home] * 3
        assert [c["chosen_by"] for c in chosen[1:]] == ["session", "session"]
        m = edge_scrape(dyn_mesh)
        assert value(m, DYN + "model_kv_cache_block_size", model=DEMO) > 0
        assert value(m, DYN + "model_total_kv_blocks", model=DEMO) > 0
        assert value(m, DYN + "model_max_num_seqs", model=DEMO) > 0  # from the mocker's --max-num-seqs
        assert value(m, DYN + "model_migration_limit", model=DEMO) >= 0  # the all-in-one knows the flag
        at_home = {"worker_id": home, "dp_rank": "0", "worker_type": "decode"}
        assert value(m, DYN + "worker_last_input_sequence_tokens", **at_home) > 0
        assert value(m, DYN + "worker_last_time_to_first_token_seconds", **at_home) > 0
        assert value(m, DYN + "worker_active_decode_blocks", **at_home) == 0
        before = m

        # A long stream holds the session's worker (one request each); the session's next request is refused
        # (hard affinity, no queue), and the stream's client goes away.
        body = {"model": DEMO, "messages": [{"role": "user", "content": "a long story " * 20}], "max_tokens": 400,
                "ignore_eos": True, "stream": True}
        url = f"http://127.0.0.1:{dyn_mesh.plan.http_port}/v1/chat/completions"
        with http.stream("POST", url, headers=SESSION, json=body) as stream:
            assert stream.status_code == 200
            lines = stream.iter_lines()  # kept: a dropped iterator closes the stream
            next(lines)  # its first token: it is decoding on the session's worker
            busy = edge_scrape(dyn_mesh)
            assert value(busy, DYN + "worker_active_decode_blocks", **at_home) >= 1
            refused = chat(http, dyn_mesh, "may I?")
            assert refused.status_code == 503, refused.text
        after = wait_until(lambda: (lambda m: m if value(m, DYN + "disconnected_clients") > value(
            before, DYN + "disconnected_clients") else None)(edge_scrape(dyn_mesh)), 10, "the stream's cancellation")

    def moved(counter: str, **labels) -> float:
        return value(after, DYN + counter, "_total", **labels) - value(before, DYN + counter, "_total", **labels)

    assert moved("model_rejection", model=DEMO, endpoint="chat_completions") == 1
    assert moved("model_cancellation", model=DEMO, endpoint="chat_completions", request_type="stream") == 1
    assert moved("requests", model=DEMO, status="error", error_type="overload") == 1
    assert value(after, DYN + "queued_requests", model=DEMO) == 0
    wait_until(lambda: value(edge_scrape(dyn_mesh), DYN + "worker_active_decode_blocks", **at_home) == 0, 10,
               "the cancelled stream's blocks released")
