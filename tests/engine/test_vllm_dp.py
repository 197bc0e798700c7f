"""One real vLLM worker with ``--data-parallel-size 2`` (CPU build, tiny random Qwen2: two engine cores, two KV
caches, two KV event publishers behind one worker) in the all-in-one mesh, kv router. Each rank is a candidate of
its own; a rank pin runs the request on that engine core; a repeated prompt goes back to the rank whose cache
holds it, which the router learnt from that core's own KV events. (Two cores load in about a minute here.)"""

from __future__ import annotations

import httpx
import openai
import pytest

from services.launcher.plan import WorkerSpec, ephemeral_plan
from services.launcher.processes import Mesh
from services.launcher.run import VLLM_CPU_FLAGS
from tests.conftest import ROOT, sdk_client, stop_cleanly
from tests.engine.conftest import ENGINE_START_S, wait_workers
from tests.mesh.conftest import wait_until
from tests.mesh.test_metrics import parse, value

pytestmark = pytest.mark.engine

MODEL = "meshfront/demo-qwen"
WORKER = "vllm-dp"
BLOCK = 128  # vLLM's CPU block size: a prompt must fill a block to be indexed


@pytest.fixture(scope="module")
def dp_mesh(tmp_path_factory, vllm_python, tiny_lm_dir, envoy_bin, nats_bin):
    worker = WorkerSpec(str(tiny_lm_dir), MODEL, "vllm", (*VLLM_CPU_FLAGS, "--data-parallel-size", "2",
                                                          "--worker-id", WORKER))
    plan = ephemeral_plan([worker], router_mode="kv", inproc=True, run_dir=ROOT / ".run" / "tests")
    mesh = Mesh(plan, tmp_path_factory.mktemp("engine-dp-logs"))
    mesh.start(timeout=ENGINE_START_S)
    try:
        wait_workers(mesh.url, MODEL, 1, timeout=ENGINE_START_S)
    except AssertionError:
        print(mesh.all_logs())
        stop_cleanly(mesh)
        raise
    yield mesh
    # A data-parallel AsyncLLM's shutdown can race its output handler: the handler may log the cores' exit
    # (EngineDeadError) with a traceback while llm.shutdown() stops them. The worker still exits on SIGTERM
    # within the grace (stop_cleanly checks it); no request is in flight by then. Left to vLLM (docs/engines.md).
    stop_cleanly(mesh, expected_tracebacks=("output_handler",))


@pytest.fixture
def client(dp_mesh):
    c = sdk_client(dp_mesh, timeout=120)
    yield c
    c.close()


def prompt(i: int) -> list[dict]:
    return [{"role": "user", "content": f"case {i}: " + " ".join(f"w{(i * 37 + k) % 911}" for k in range(150))}]


def routed(client: openai.OpenAI, messages: list[dict], **nvext) -> tuple[dict, int]:
    """The router's decision record (nvext.routing) and the cached prompt tokens vLLM reported."""
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2,
                                       extra_body={"nvext": {"extra_fields": ["routing"], **nvext}})
    cached = r.usage.prompt_tokens_details.cached_tokens if r.usage.prompt_tokens_details else 0
    return r.model_extra["nvext"]["routing"], cached or 0


def test_each_engine_core_is_a_candidate_and_a_rank_pin_runs_there(client):
    record, _ = routed(client, prompt(99))
    assert sorted((c["worker_id"], c["dp_rank"]) for c in record["candidates"]) == [(WORKER, 0), (WORKER, 1)]
    for rank in (0, 1):
        record, _ = routed(client, prompt(100 + rank), dp_rank=rank)
        assert (record["worker_id"], record["dp_rank"]) == (WORKER, rank)


def kv_hits(mesh, rank: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{mesh.plan.metrics_ports['gateway-0']}/metrics", timeout=5).text
    return value(parse(text), "meshfront_router_worker_cached_tokens", "_total", worker=WORKER, dp_rank=str(rank))


def test_a_repeated_prompt_goes_back_to_the_engine_core_whose_cache_holds_it(dp_mesh, client):
    first, cached = routed(client, prompt(7), dp_rank=1)
    assert first["dp_rank"] == 1 and cached == 0

    def hit():  # once core 1's KV events reached the router, an unpinned repeat goes back there and hits its cache
        record, cached = routed(client, prompt(7))
        return (record, cached) if record["dp_rank"] == 1 and cached >= BLOCK else None

    record, cached = wait_until(hit, 30, "the repeated prompt routed to rank 1's cache")
    by_rank = {c["dp_rank"]: c["overlap_blocks"] for c in record["candidates"]}
    assert by_rank[1] > 0 and by_rank[0] == 0  # the index knows core 1 holds it, and core 0 does not
    assert kv_hits(dp_mesh, 1) >= cached
    # vLLM ran it on the core it was sent to: core 0's own cache does not hold the prompt.
    _, cached_on_0 = routed(client, prompt(7), dp_rank=0)
    assert cached_on_0 == 0


def test_a_rank_the_worker_lacks_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=prompt(1), max_tokens=2, extra_body={"nvext": {
            "dp_rank": 2}})
    assert e.value.body["param"] == "nvext.dp_rank" and "data-parallel rank" in e.value.body["message"]
