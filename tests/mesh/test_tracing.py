"""One trace per request: Envoy's edge span and every stage's, joined by W3C traceparent, found by x-request-id.

The mesh sends its spans over OTLP/gRPC to a TraceService server in this test process (opentelemetry-proto's),
so the assertions read exactly what left each process. `meshfront run --trace` with Arize Phoenix, and
`meshfront trace`, are checked end to end at the bottom.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from concurrent import futures

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from services.launcher.engine_env import PHOENIX
from services.launcher.plan import WorkerSpec
from tests.conftest import IN_CI, ROOT, sdk_client, stop_cleanly
from tests.mesh.conftest import DEMO, start_mesh, wait_until
from tests.mesh.test_launcher_supervision import Launcher

pytestmark = pytest.mark.mesh

REQUEST_ID = "meshfront.request_id"
# `meshfront trace`, from this checkout whichever one the venv's console script was installed from.
TRACE = [sys.executable, "-c", "import sys; from services.cli import main; main(['trace', *sys.argv[1:]])"]


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps every span exported to it: (service.name, span) pairs."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, object]] = []
        self._lock = threading.Lock()

    def Export(self, request, context):
        with self._lock:
            for rs in request.resource_spans:
                service = next((a.value.string_value for a in rs.resource.attributes if a.key == "service.name"), "")
                for ss in rs.scope_spans:
                    self.spans.extend((service, s) for s in ss.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    def trace_of(self, request_id: str) -> list[tuple[str, object]]:
        with self._lock:
            ids = {s.trace_id for _, s in self.spans if attribute(s, REQUEST_ID) == request_id}
            assert len(ids) <= 1, f"request {request_id} is in {len(ids)} traces"
            return [(svc, s) for svc, s in self.spans if s.trace_id in ids]


def attribute(span, key: str):
    for a in span.attributes:
        if a.key == key:
            value = a.value
            return getattr(value, value.WhichOneof("value"))
    return None


@pytest.fixture(scope="module")
def collector() -> Iterator[tuple[Collector, int]]:
    c = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(c, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield c, port
    server.stop(0)


@pytest.fixture(scope="module")
def traced_mesh(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin, collector):
    """A split mesh whose requests are disaggregated (one prefill and one decode worker), tracing on."""
    def worker(role: str) -> WorkerSpec:
        return WorkerSpec(str(demo_model_dir), DEMO, "mocker", ("--speedup-ratio", "2", "--disaggregation-mode", role,
                                                                "--worker-id", f"{role}-0"))

    m = start_mesh(tmp_path_factory, [worker("prefill"), worker("decode")], router_mode="kv",
                   otlp_endpoint=f"http://127.0.0.1:{collector[1]}")
    yield m
    stop_cleanly(m)


# Each stage's spans, by the process (service.name) that sent them.
EXPECTED = {
    "meshfront-envoy": set(),  # its edge span's name is Envoy's own: checked as the root below
    "meshfront-gateway": {"gateway ChatCompletions"},
    "meshfront-preprocessor": {"preprocessor Preprocess", "preprocess", "preprocess.template", "preprocess.tokenize"},
    "meshfront-router": {"router Route", "route"},
    "meshfront-postprocessor": {"postprocess", "kv_transfer"},
    "meshfront-mocker": {"worker", "worker.queue_wait", "worker.prefill", "worker.first_token", "worker.decode"},
}


def test_one_trace_holds_envoy_and_every_stage_and_is_found_by_the_request_id(traced_mesh, collector):
    client = sdk_client(traced_mesh, timeout=60)
    rid = f"trace-{uuid.uuid4().hex[:12]}"
    raw = client.chat.completions.with_raw_response.create(
        model=DEMO, messages=[{"role": "user", "content": "hello there"}], max_tokens=8,
        extra_headers={"x-request-id": rid})
    assert raw.headers["x-request-id"] == rid  # echoed as sent
    assert raw.parse().choices[0].message.content

    def complete():
        spans = collector[0].trace_of(rid)
        names = {(svc, s.name) for svc, s in spans}
        want = {(svc, n) for svc, ns in EXPECTED.items() for n in ns}
        # The two legs' workers are two processes that export on their own schedules: wait for both.
        legs = {attribute(s, "meshfront.disaggregation_role") for svc, s in spans if s.name == "worker"}
        edge = any(svc == "meshfront-envoy" for svc, _ in spans)
        return spans if want <= names and edge and legs == {"prefill", "decode"} else None

    spans = wait_until(complete, 30, f"every stage's spans of request {rid}, both legs' workers'")
    by_id = {s.span_id: (svc, s) for svc, s in spans}
    roots = [(svc, s) for svc, s in spans if s.parent_span_id not in by_id]
    assert [svc for svc, _ in roots] == ["meshfront-envoy"], roots  # one tree, rooted at the edge
    gateway = next(s for svc, s in spans if s.name == "gateway ChatCompletions")
    assert by_id[gateway.parent_span_id][0] == "meshfront-envoy"
    assert attribute(gateway, REQUEST_ID) == rid
    # Both legs ran on their own workers, under the postprocessor's span.
    post = next(s for svc, s in spans if s.name == "postprocess")
    assert all(s.parent_span_id == post.span_id for svc, s in spans if s.name in ("worker", "kv_transfer"))
    route = next(s for svc, s in spans if s.name == "route")
    assert attribute(route, "meshfront.prefill_worker_id") == "prefill-0"
    assert attribute(route, "meshfront.worker_id") == "decode-0"
    client.close()


def test_a_request_without_an_id_gets_one_and_its_trace(traced_mesh, collector):
    r = httpx.post(f"{traced_mesh.url}/v1/chat/completions", timeout=60, json={
        "model": DEMO, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 200, r.text
    rid = r.headers["x-request-id"]
    uuid.UUID(rid)  # Envoy made it up
    wait_until(lambda: any(s.name == "worker.decode" for _, s in collector[0].trace_of(rid)), 30,
               f"the trace of the made-up request id {rid}")


def test_a_refused_request_still_echoes_its_id(traced_mesh):
    r = httpx.post(f"{traced_mesh.url}/v1/chat/completions", timeout=30, headers={"x-request-id": "bad-1"},
                   json={"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 404
    assert r.headers["x-request-id"] == "bad-1"


# -- meshfront run --trace: Arize Phoenix as the viewer, meshfront trace as its reader ------------------------------

def require_phoenix() -> None:
    if not PHOENIX.is_ready():
        message = f"{PHOENIX.venv} is not built (make engine-env builds it)"
        if IN_CI:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


# Phoenix imports ~140 packages: ~15 s to start on a quiet machine, 5 minutes on a 2-core one at load 28.
@pytest.mark.timeout(900)
def test_meshfront_run_trace_starts_phoenix_and_meshfront_trace_prints_the_request(tmp_path, demo_model_dir,
                                                                                   envoy_bin, nats_bin):
    require_phoenix()
    lch = Launcher(tmp_path, "--model-dir", str(demo_model_dir), "--model-name", DEMO, "--workers", "1",
                   "--embedding-workers", "0", "--image-workers", "0", "--video-workers", "0", "--trace")
    try:
        lch.wait_healthy(1, 150)
        found = wait_until(lambda: re.search(r"Traces: (http://127\.0\.0\.1:\d+)", lch.log()), 600,
                           f"Phoenix's URL in the launcher's output\n{lch.log()[-4000:]}")
        url = found[1]
        rid = f"phoenix-{uuid.uuid4().hex[:8]}"
        r = httpx.post(f"{lch.url}/v1/chat/completions", timeout=60, headers={"x-request-id": rid},
                       json={"model": DEMO, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert r.status_code == 200, r.text
        names = ("gateway ChatCompletions", "preprocess.tokenize", "route", "postprocess", "worker.prefill",
                 "worker.decode")

        def whole_tree() -> subprocess.CompletedProcess | None:
            # Each process exports its spans on its own (in batches, retried while Phoenix's OTLP port comes up):
            # the trace can be found before every stage's spans are in it.
            out = subprocess.run([*TRACE, rid, "--url", url, "--wait-s", "30"], capture_output=True, text=True,
                                 timeout=60, cwd=ROOT)
            return out if out.returncode == 0 and all(n in out.stdout for n in names) else None

        out = wait_until(whole_tree, 120, f"every stage's spans of {rid} in Phoenix")
        assert f"request {rid}" in out.stdout
        missing = subprocess.run([*TRACE, "no-such-request", "--url", url, "--wait-s", "1"], capture_output=True,
                                 text=True, timeout=60, cwd=ROOT)
        assert missing.returncode == 1 and "no trace" in missing.stderr
    finally:
        lch.kill_everything()


def test_the_all_in_one_shape_traces_the_same_stages_in_one_process(tmp_path_factory, demo_model_dir, envoy_bin,
                                                                     nats_bin, collector):
    """In-process the stages run in the gateway's task: their spans nest under its span without any header."""
    m = start_mesh(tmp_path_factory, [WorkerSpec(str(demo_model_dir), DEMO, "mocker", ("--speedup-ratio", "2"))],
                   inproc=True, otlp_endpoint=f"http://127.0.0.1:{collector[1]}")
    try:
        rid = f"inproc-{uuid.uuid4().hex[:12]}"
        r = httpx.post(f"{m.url}/v1/completions", timeout=60, headers={"x-request-id": rid},
                       json={"model": DEMO, "prompt": "hello", "max_tokens": 3})
        assert r.status_code == 200, r.text
        want = {("meshfront-allinone", n) for n in ("gateway Completions", "preprocess", "preprocess.tokenize",
                                                     "route", "postprocess")}
        want |= {("meshfront-mocker", n) for n in ("worker", "worker.prefill", "worker.decode")}
        def complete():
            spans = collector[0].trace_of(rid)
            seen = {(v, x.name) for v, x in spans}
            return spans if want <= seen and any(v == "meshfront-envoy" for v, _ in seen) else None

        spans = wait_until(complete, 30, f"the all-in-one's spans of {rid}")
        by_id = {s.span_id: (v, s) for v, s in spans}
        gateway = next(s for _, s in spans if s.name == "gateway Completions")
        for name in ("preprocess", "route", "postprocess"):
            assert next(s for _, s in spans if s.name == name).parent_span_id == gateway.span_id, name
        assert by_id[gateway.parent_span_id][0] == "meshfront-envoy"
    finally:
        stop_cleanly(m)
