"""Disaggregated prefill and decode on two real vLLM workers (CPU build, tiny random Qwen2) behind the split mesh.

The prompt's KV blocks move with vLLM's own shared-storage ``ExampleConnector`` (``--kv-transfer-config``,
``kv_both`` on both workers): the one KV connector vLLM's CPU build runs between two processes here
(docs/engines.md, "Disaggregation"). The prefill worker writes each new prompt's full blocks to a shared
directory; the decode worker, given the prompt plus the first token, loads them instead of computing them.

The tiny random model repeats one token, so equal tokens alone prove little: the test also compares each
token's log probability with vLLM's aggregated run, which moves (by about 0.3) when the decode worker's KV is
not the prefill worker's (a zeroed copy of the stored blocks, tried by hand).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

import pytest

from services.launcher.plan import WorkerSpec, ephemeral_plan
from services.launcher.processes import Mesh
from services.launcher.run import VLLM_CPU_FLAGS
from tests.conftest import ROOT, sdk_client, stop_cleanly
from tests.engine.conftest import ENGINE_START_S, scrape, wait_workers

pytestmark = pytest.mark.engine

MODEL = "meshfront/demo-qwen"
PREFILL, DECODE = "vllm-0", "vllm-1"  # the plan's process names, in WorkerSpec order
BLOCK = 128  # vLLM's CPU block size


@pytest.fixture(scope="module")
def disagg_mesh(tmp_path_factory, vllm_python, tiny_lm_dir, envoy_bin, nats_bin, offline_vllm):
    # (offline_vllm: vLLM's reference loads while this mesh starts)
    store = tmp_path_factory.mktemp("kv-store")
    connector = json.dumps({"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                            "kv_connector_extra_config": {"shared_storage_path": str(store)}})
    flags = (*VLLM_CPU_FLAGS, "--kv-transfer-config", connector)
    workers = [WorkerSpec(str(tiny_lm_dir), MODEL, "vllm", (*flags, "--disaggregation-mode", mode))
               for mode in ("prefill", "decode")]
    plan = ephemeral_plan(workers, router_mode="kv", run_dir=ROOT / ".run" / "tests")
    mesh = Mesh(plan, tmp_path_factory.mktemp("disagg-mesh-logs"))
    mesh.start(timeout=ENGINE_START_S)
    try:
        wait_workers(mesh.url, MODEL, len(workers), timeout=ENGINE_START_S)
    except AssertionError:
        print(mesh.all_logs())
        stop_cleanly(mesh)
        raise
    yield mesh
    try:
        # A loaded machine can see vLLM's engine core go before its output handler at shutdown, which
        # logs that with a traceback (the requests above were all answered by then).
        stop_cleanly(mesh, expected_tracebacks=("output_handler",))
    finally:
        for name in (PREFILL, DECODE):  # vLLM's engine core outlives a parent that died first
            with contextlib.suppress(ProcessLookupError):
                os.killpg(mesh.procs[name].pid, signal.SIGKILL)


def metric(mesh: Mesh, worker: str, name: str) -> float:
    return scrape(mesh.plan.metrics_ports[worker]).get(name, 0.0)


# Two engines load for the module (a minute each on an idle machine), and vLLM's offline engine for the reference.
@pytest.mark.timeout(900)
def test_greedy_output_through_the_two_legs_equals_vllms_aggregated_output(disagg_mesh, offline_vllm, tiny_lm_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_lm_dir)
    # Four full blocks and some: what the decode worker loads is every full block of the prompt.
    content = " ".join(f"step {i} of the routing plan;" for i in range(80))
    messages = [{"role": "user", "content": content}]
    prompt_ids = list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                              return_dict=False))
    assert len(prompt_ids) > 3 * BLOCK
    n = 16
    # Deltas: the gateway warms each worker up when it registers, and a worker that registers after the gateway
    # started is warmed while the mesh already serves: wait for both warm-ups (the prefill worker's runs both
    # legs), or one still running would count its decode tokens here.
    deadline = time.monotonic() + 120
    while disagg_mesh.full_log("gateway-0").count(" warm in ") < 2:
        assert time.monotonic() < deadline, "the gateway did not warm both workers up"
        time.sleep(0.2)
    names = ("vllm:generation_tokens_total", "vllm:external_prefix_cache_hits_total")
    before = {(w, name): metric(disagg_mesh, w, name) for w in (PREFILL, DECODE) for name in names}
    client = sdk_client(disagg_mesh, timeout=300)
    try:
        done = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=n, temperature=0,
                                              logprobs=True, extra_body={"ignore_eos": True})
    finally:
        client.close()
    assert done.usage.prompt_tokens == len(prompt_ids) and done.usage.completion_tokens == n
    mesh_logprobs = [lp.logprob for lp in done.choices[0].logprobs.content]
    ids, logprobs = offline_vllm.generate(prompt_ids, n)
    assert tok.decode(ids) == done.choices[0].message.content
    # Within the engine's own precision: vLLM runs the tiny model in bfloat16 on a CPU, and a decode over
    # transferred KV rounds a few logits one step (2^-6 at these magnitudes) off the aggregated run's, the same
    # token either way (seen on a machine where the offline reference repeats itself exactly).
    assert mesh_logprobs == pytest.approx(logprobs, abs=2**-6 + 1e-3)
    # The legs ran where they should: one token on the prefill worker, the rest on the decode worker, which
    # loaded the prompt's full blocks through the connector instead of computing them.
    def delta(worker: str, name: str) -> float:
        return metric(disagg_mesh, worker, name) - before[(worker, name)]

    assert delta(PREFILL, "vllm:generation_tokens_total") == 1
    assert delta(DECODE, "vllm:generation_tokens_total") == n - 1
    loaded = delta(DECODE, "vllm:external_prefix_cache_hits_total")
    assert loaded == (len(prompt_ids) - 1) // BLOCK * BLOCK, loaded
