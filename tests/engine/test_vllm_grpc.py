"""Two stock vLLM engines serving their own gRPC (`vllm serve --grpc`: SMG's vllm_engine service, CPU build, the tiny
random Qwen2), started by the test outside Meshfront, attached by address (`meshfront attach`, as `meshfront run
--engine-grpc` runs it) and served through NATS, Envoy and the split mesh with the kv router; no Meshfront worker.

Driven with the official openai SDK, as a user would. One mesh for the module; the tests run in file order and the
last kills an engine.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from typing import Any

import anthropic
import grpc
import httpx
import jsonschema
import numpy as np
import pytest
import tritonclient.grpc as tritonclient_grpc
from smg_grpc_proto.generated import vllm_engine_pb2, vllm_engine_pb2_grpc

from services.launcher.plan import ProcessSpec, WorkerSpec, ephemeral_plan, free_port
from services.launcher.processes import Mesh
from services.launcher.run import VLLM_CPU_FLAGS
from services.workers.attach.core import VLLM_ENGINE, worker_id
from tests.conftest import ROOT, sdk_client, stop_cleanly
from tests.engine.conftest import ENGINE_START_S, wait_workers
from tests.engine.test_vllm_mesh import _byte_level_vocab, _token_ids
from tests.mesh.chaos_client import stream_then_hang_up
from tests.mesh.conftest import wait_until

pytestmark = pytest.mark.engine

MODEL = "meshfront/demo-qwen"
ENGINES = ("engine-0", "engine-1")
BLOCK = 128  # vLLM's CPU block size: the cards must say so


@pytest.fixture(scope="module")
def addresses() -> dict[str, str]:
    """Each engine's gRPC address, by its process name."""
    return {name: f"127.0.0.1:{free_port()}" for name in ENGINES}


@pytest.fixture(scope="module")
def grpc_mesh(tmp_path_factory, vllm_python, tiny_lm_dir, envoy_bin, nats_bin, offline_vllm, addresses):
    attach = WorkerSpec(str(tiny_lm_dir), MODEL, "attach", (
        *(flag for a in addresses.values() for flag in ("--engine-grpc", a)),
        "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3"))
    plan = ephemeral_plan([attach], router_mode="kv", run_dir=ROOT / ".run" / "tests")
    mesh = Mesh(plan, tmp_path_factory.mktemp("grpc-engine-logs"))
    mesh.log_dir.mkdir(parents=True, exist_ok=True)
    # The engines first, as an operator's would be (`vllm serve --grpc`; docs/engine-grpc.md says why the module):
    # Mesh.start waits for their ports with the mesh's own, while they load.
    for name, address in addresses.items():
        port = int(address.rsplit(":", 1)[1])
        mesh.start_process(ProcessSpec(name, [
            vllm_python, "-m", "vllm.entrypoints.launchers.grpc_server", "--model", str(tiny_lm_dir),
            "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "4096",
            *VLLM_CPU_FLAGS], port, {"VLLM_HOST_IP": "127.0.0.1"}))
    try:
        mesh.start(timeout=ENGINE_START_S)
        wait_workers(mesh.url, MODEL, len(ENGINES), timeout=ENGINE_START_S)
    except BaseException:
        print(mesh.all_logs())
        mesh.stop()
        reap(mesh)
        raise
    yield mesh
    try:
        # The engines' own log lines, not failures of ours: its grpc.aio server logs a cancelled call's
        # CancelledError with a traceback (a client that left, a sequence the postprocessor ended first), and
        # AsyncLLM's __del__ can run its shutdown again at interpreter exit after SIGTERM.
        stop_cleanly(mesh, expected_tracebacks=("_schedule_rpc_coro", "vllm/v1/engine/async_llm.py"))
    finally:
        reap(mesh)


def reap(mesh: Mesh) -> None:
    """vLLM's engine core outlives a SIGKILLed parent: each engine's whole process group goes."""
    for name in ENGINES:
        with contextlib.suppress(ProcessLookupError, KeyError):
            os.killpg(mesh.procs[name].pid, signal.SIGKILL)


@pytest.fixture
def client(grpc_mesh):
    c = sdk_client(grpc_mesh, timeout=120)
    yield c
    c.close()


def running(address: str) -> int:
    """The engine's own count of requests it runs (GetLoads, its scheduler's stats)."""
    with grpc.insecure_channel(address) as channel:
        loads = vllm_engine_pb2_grpc.VllmEngineStub(channel).GetLoads(vllm_engine_pb2.GetLoadsRequest(), timeout=5)
    return sum(load.num_running_reqs + load.num_waiting_reqs for load in loads.loads)


def test_cards_carry_the_engines_sizes(grpc_mesh):
    log = grpc_mesh.logs("attach-0")
    assert log.count(f"block size {BLOCK}") == 2 and log.count("context 4096") == 2, log


def test_chat_streamed_and_not(client):
    messages = [{"role": "user", "content": "Say something."}]
    done = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0,
                                          extra_body={"ignore_eos": True})
    assert done.choices[0].finish_reason == "length"
    assert done.usage.completion_tokens == 8 and done.choices[0].message.content
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0,
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == done.choices[0].message.content  # greedy: the same tokens either way
    assert chunks[-1].usage.completion_tokens == 8


def test_greedy_tokens_equal_vllm_offline_generate(client, offline_vllm, tiny_lm_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_lm_dir)
    messages = [{"role": "user", "content": "Count the ways a mesh can route a token."}]
    prompt_ids = list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                              return_dict=False))
    n = 24
    done = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=n, temperature=0,
                                          logprobs=True, extra_body={"ignore_eos": True})
    assert done.usage.prompt_tokens == len(prompt_ids)
    assert _token_ids(done.choices[0].logprobs.content, _byte_level_vocab(tok)) == offline_vllm.generate(
        prompt_ids, n)[0]


def router_index(mesh: Mesh) -> tuple[dict[str, float], float]:
    """The router's index: the blocks it holds per engine, and the KV events it has applied so far."""
    text = httpx.get(f"http://127.0.0.1:{mesh.plan.metrics_ports['router']}/metrics", timeout=5).text
    blocks = {w: float(n) for w, n in re.findall(r'^meshfront_router_kv_index_blocks\{worker="([^"]+)"\} ([0-9.e+]+)$',
                                                 text, re.M)}
    (events,) = re.findall(r"^meshfront_router_kv_events_total ([0-9.e+]+)$", text, re.M)
    return blocks, float(events)


def test_repeated_long_prompt_goes_to_the_engine_that_caches_it(client, grpc_mesh):
    prompt = " ".join(f"item {i} of the shared prefix;" for i in range(120))  # ~700 tokens, 5 blocks
    messages = [{"role": "user", "content": prompt}]
    _, events_before = router_index(grpc_mesh)
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2,
                                           extra_body={"nvext": {"extra_fields": ["worker_id"]}})
    assert first.usage.prompt_tokens > 4 * BLOCK
    served = first.model_extra["nvext"]["worker_id"]["decode_worker_id"]

    def indexed() -> bool:
        blocks, events = router_index(grpc_mesh)
        return events > events_before and blocks.get(served, 0) >= 4

    # The first request's KV events reach the router (engine, attach's relay, NATS) before anything repeats it.
    # Counted on the engine that served it, once events came: an engine whose relay subscribed during the
    # servicer's warm-up holds the warm-up's blocks in the index until its next step publishes the prefix-cache
    # reset that ended the warm-up, with this request's blocks (vLLM queues events until a step): a total taken
    # before this request then went down, not up (CI).
    wait_until(indexed, 60, "the prompt's blocks in the router's index")
    for _ in range(4):
        again = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2,
                                               extra_body={"nvext": {"extra_fields": ["worker_id", "routing"]}})
        cached = again.usage.prompt_tokens_details.cached_tokens
        # Round-robin would send every other repeat to the engine that has nothing cached.
        assert cached >= 4 * BLOCK and cached % BLOCK == 0, (cached, again.model_extra, router_index(grpc_mesh))


WEATHER = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"enum": [1, 2, 3]}},
           "required": ["city", "days"], "additionalProperties": False}


def test_a_named_tool_call_and_structured_output_are_guided_on_the_engine(client):
    """What the engine proto carries of guided decoding: the tiny random model writes what a schema or a regex
    allows only if the engine was told it."""
    call = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather?"}], max_tokens=32, temperature=0,
        tools=[{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}],
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    [tool] = call.choices[0].message.tool_calls
    assert tool.function.name == "get_weather"
    # The schema's first property, as the engine's grammar forced it. (JSON allows whitespace anywhere between
    # tokens, and greedy decoding of random weights can take it for ever: the object need not close.)
    assert re.match(r'\{\s*"city"\s*:', tool.function.arguments), tool.function.arguments
    assert call.usage.prompt_tokens > 0 and call.usage.completion_tokens > 0
    schema = {"type": "string", "enum": ["yes", "no"]}  # no room for whitespace: the whole answer is checked
    done = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Yes or no?"}], max_tokens=20, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}})
    jsonschema.validate(json.loads(done.choices[0].message.content), schema)
    assert done.choices[0].finish_reason == "stop"
    regex = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Pick."}],
                                           max_tokens=12, temperature=0, extra_body={"guided_regex": "[0-9]{3}"})
    assert re.fullmatch("[0-9]{3}", regex.choices[0].message.content)


def test_kserve_and_anthropic_clients_are_served_by_the_engines(grpc_mesh):
    triton = tritonclient_grpc.InferenceServerClient(grpc_mesh.grpc_target)
    try:
        text = tritonclient_grpc.InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([b"Say something."], dtype=np.object_))
        result = triton.infer(MODEL, [text], parameters={"max_tokens": 4, "ignore_eos": True})
    finally:
        triton.close()
    assert result.as_numpy("text_output")[0]
    claude = anthropic.Anthropic(base_url=grpc_mesh.url, api_key="unused", max_retries=0, timeout=120)
    try:
        message = claude.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "Hi."}])
    finally:
        claude.close()
    assert message.content[0].text and 1 <= message.usage.output_tokens <= 4
    assert message.stop_reason in ("max_tokens", "end_turn")


def test_client_disconnect_leaves_the_engines_nothing_running(grpc_mesh, addresses):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Talk for a long time."}],
            "max_tokens": 2000, "ignore_eos": True}
    stream_then_hang_up(grpc_mesh.plan.http_port, body, frames=3)
    # The Abort goes at once (tests/service/postprocessor/test_engine_grpc.py); this reads the engine's own
    # scheduler stats through GetLoads, a step or two behind on a loaded machine (1 s was missed by 55 ms).
    deadline = time.monotonic() + 3.0
    while any(running(a) for a in addresses.values()):
        assert time.monotonic() < deadline, "an engine still runs the request 3 s after the client left"
        time.sleep(0.05)


def test_killing_the_serving_engine_mid_stream_is_invisible_at_temperature_0(client, grpc_mesh, addresses):
    request: dict[str, Any] = {
        "model": MODEL, "messages": [{"role": "user", "content": "Write a long story about routers."}],
               "max_tokens": 160, "temperature": 0, "extra_body": {"ignore_eos": True}}
    undisturbed = client.chat.completions.create(**request).choices[0].message.content
    by_id = {worker_id(VLLM_ENGINE, address): name for name, address in addresses.items()}
    stream = client.chat.completions.create(**{**request, "extra_body": {
        **request["extra_body"], "nvext": {"extra_fields": ["worker_id"]}}}, stream=True)
    parts, serving = [], ""
    for chunk in stream:
        if not serving:
            serving = by_id[chunk.model_extra["nvext"]["worker_id"]["decode_worker_id"]]
        parts.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
        if len(parts) == 4:  # a few tokens in: a fast CPU engine must not be done yet
            os.killpg(grpc_mesh.procs[serving].pid, signal.SIGKILL)
    assert "".join(parts) == undisturbed
    # Its card leaves at the registrar's next health check; the other engine serves on.
    wait_workers(grpc_mesh.url, MODEL, 1, timeout=10)
    assert "deregistering it" in grpc_mesh.logs("attach-0")
    after = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Still there?"}],
                                           max_tokens=4)
    assert after.usage.completion_tokens == 4
