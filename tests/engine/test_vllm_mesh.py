"""Two real vLLM workers (CPU build, tiny random Qwen2) behind NATS, Envoy and the split mesh, kv router.

Driven with the official openai SDK through Envoy, as a user would. The tests share one mesh and
run in file order: the last two kill workers.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from pathlib import Path

import jsonschema
import openai
import pytest

from services.launcher.plan import WorkerSpec, ephemeral_plan
from services.launcher.processes import Mesh
from services.launcher.run import VLLM_CPU_FLAGS
from tests.conftest import ROOT, sdk_client, stop_cleanly
from tests.engine.conftest import ENGINE_START_S, scrape, wait_workers
from tests.mesh.chaos_client import stream_then_hang_up

pytestmark = pytest.mark.engine

MODEL = "meshfront/demo-qwen"
WORKERS = ("vllm-0", "vllm-1")
VLLM_FLAGS = (*VLLM_CPU_FLAGS, "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3")
BLOCK = 128  # vLLM's CPU block size; the worker cards must say so


@pytest.fixture(scope="module")
def engine_mesh(tmp_path_factory, vllm_python, tiny_lm_dir, envoy_bin, nats_bin, offline_vllm):
    # (offline_vllm: vLLM's reference loads while this mesh starts, when no module before started it)
    workers = [WorkerSpec(str(tiny_lm_dir), MODEL, "vllm", (*VLLM_FLAGS, "--worker-id", wid)) for wid in WORKERS]
    plan = ephemeral_plan(workers, router_mode="kv", run_dir=ROOT / ".run" / "tests")
    mesh = Mesh(plan, tmp_path_factory.mktemp("engine-mesh-logs"))
    mesh.start(timeout=ENGINE_START_S)
    try:
        wait_workers(mesh.url, MODEL, len(WORKERS), timeout=ENGINE_START_S)
    except AssertionError:
        print(mesh.all_logs())
        stop_cleanly(mesh)
        raise
    yield mesh
    try:
        # test_a_worker_whose_engine_dies_deregisters_and_exits kills vLLM's engine core on purpose,
        # and vLLM's output handler logs the engine's death with a traceback.
        stop_cleanly(mesh, expected_tracebacks=("output_handler",))
    finally:
        reap_groups(mesh)


def reap_groups(mesh: Mesh) -> None:
    """Kills what is left of each worker's process group: vLLM's engine core outlives a SIGKILLed parent
    (it waits on its ZMQ socket forever), and the tests SIGKILL workers on purpose."""
    for name in WORKERS:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(mesh.procs[name].pid, signal.SIGKILL)


@pytest.fixture
def client(engine_mesh):
    c = sdk_client(engine_mesh, timeout=120)
    yield c
    c.close()


def metrics(mesh: Mesh, worker: str) -> dict[str, float]:
    return scrape(mesh.plan.metrics_ports[worker])


def running(mesh: Mesh, worker: str) -> float:
    return metrics(mesh, worker)["vllm:num_requests_running"]


def test_card_reports_the_engines_real_sizes(engine_mesh):
    log = engine_mesh.logs("vllm-0")
    assert f"block size {BLOCK}" in log and "context 4096" in log, log


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


def test_every_sampling_knob_reaches_vllm_and_seeds_repeat(client):
    ask = {"model": MODEL, "messages": [{"role": "user", "content": "Sample."}], "max_tokens": 10,
           "temperature": 1.3, "top_p": 0.9, "seed": 1234, "frequency_penalty": 0.5, "presence_penalty": 0.4,
           "logprobs": True, "top_logprobs": 3,
           "extra_body": {"top_k": 50, "min_p": 0.01, "repetition_penalty": 1.1, "min_tokens": 10}}
    a, b = (client.chat.completions.create(**ask) for _ in range(2))
    assert a.choices[0].message.content == b.choices[0].message.content  # same seed, same tokens
    assert a.usage.completion_tokens == 10
    assert all(len(t.top_logprobs) == 3 for t in a.choices[0].logprobs.content)


def _token_ids(content_logprobs, vocab_by_bytes: dict[bytes, int]) -> list[int]:
    return [vocab_by_bytes[bytes(lp.bytes)] for lp in content_logprobs]


def test_greedy_tokens_equal_vllm_offline_generate(client, offline_vllm, tiny_lm_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_lm_dir)
    messages = [{"role": "user", "content": "Count the ways a mesh can route a token."}]
    prompt_ids = list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                              return_dict=False))
    n = 24
    done = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=n, temperature=0,
                                          logprobs=True, extra_body={"ignore_eos": True})
    assert done.usage.prompt_tokens == len(prompt_ids)  # the mesh sent the same prompt ids
    vocab_by_bytes = _byte_level_vocab(tok)
    mesh_ids = _token_ids(done.choices[0].logprobs.content, vocab_by_bytes)
    assert mesh_ids == offline_vllm.generate(prompt_ids, n)[0]


def _byte_level_vocab(tok) -> dict[bytes, int]:
    """bytes -> id for a byte-level BPE vocabulary (exact even for tokens that split a UTF-8 character)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    decode = {u: b for b, u in bytes_to_unicode().items()}
    out = {}
    for token, i in tok.get_vocab().items():
        if all(ch in decode for ch in token):
            out[bytes(decode[ch] for ch in token)] = i
    out.update({token.encode(): i for token, i in tok.get_added_vocab().items()})
    return out


def test_repeated_long_prompt_goes_to_the_worker_that_caches_it(client, engine_mesh):
    prompt = " ".join(f"item {i} of the shared prefix;" for i in range(120))  # ~700 tokens, 5 blocks
    messages = [{"role": "user", "content": prompt}]
    hits_before = sum(metrics(engine_mesh, w)["vllm:prefix_cache_hits_total"] for w in WORKERS)
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert first.usage.prompt_tokens > 4 * BLOCK
    reported = 0
    for _ in range(4):
        time.sleep(0.5)  # the first request's KV events reach the router over ZMQ and NATS
        again = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
        cached = again.usage.prompt_tokens_details.cached_tokens
        # Round-robin would send every other repeat to the worker that has nothing cached.
        assert cached >= 4 * BLOCK and cached % BLOCK == 0, cached
        reported += cached
    hits = sum(metrics(engine_mesh, w)["vllm:prefix_cache_hits_total"] for w in WORKERS) - hits_before
    assert hits == reported  # what the client saw is what vLLM itself counted


def test_json_schema_output_is_valid(client):
    schema = {"type": "string", "enum": ["yes", "no"]}
    done = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Yes or no?"}], max_tokens=20, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}})
    jsonschema.validate(json.loads(done.choices[0].message.content), schema)
    assert done.choices[0].finish_reason == "stop"


def test_vllm_style_regex_choice_and_grammar_constrain_the_output(client):
    ask = {"model": MODEL, "messages": [{"role": "user", "content": "Pick."}], "max_tokens": 12, "temperature": 0}
    choice = client.chat.completions.create(**ask, extra_body={"structured_outputs": {"choice": ["red", "green"]}})
    assert choice.choices[0].message.content in ("red", "green")
    regex = client.chat.completions.create(**ask, extra_body={"guided_regex": "[0-9]{3}"})
    assert re.fullmatch("[0-9]{3}", regex.choices[0].message.content)
    grammar = client.chat.completions.create(**ask, extra_body={"guided_grammar": 'root ::= "a" | "b"'})
    assert grammar.choices[0].message.content in ("a", "b")


def test_prompt_over_the_context_window_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "word " * 5000}],
                                       max_tokens=4)
    assert "context" in str(err.value)


def test_a_thinking_budget_closes_the_block_the_prompt_opened(client, tiny_lm_dir):
    """nvext.max_thinking_tokens reaches vLLM's sampler as thinking_token_budget: with the prompt ending inside
    <think> (its newline counts), the budget's last token is </think>, which the random model never writes."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_lm_dir)
    prompt = list(tok.apply_chat_template([{"role": "user", "content": "Think first."}], add_generation_prompt=True,
                                          tokenize=True, return_dict=False)) + tok.encode("<think>\n")
    budget = 4

    def tokens(nvext: dict) -> list[str]:
        done = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, logprobs=0,
                                         extra_body={"ignore_eos": True, "nvext": nvext})
        assert done.usage.completion_tokens == 12
        return done.choices[0].logprobs.tokens

    free, capped = tokens({}), tokens({"max_thinking_tokens": budget})
    assert "</think>" not in free
    assert capped.index("</think>") == budget - 1 and capped[:budget - 1] == free[:budget - 1], capped


def test_client_disconnect_leaves_vllm_nothing_running(engine_mesh):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Talk for a long time."}],
            "max_tokens": 2000, "ignore_eos": True}
    stream_then_hang_up(engine_mesh.plan.http_port, body, frames=3)
    deadline = time.monotonic() + 1.0
    while any(running(engine_mesh, w) for w in WORKERS):
        assert time.monotonic() < deadline, "vLLM still runs the request 1 s after the client left"
        time.sleep(0.05)
    # Its KV blocks are free again (cached blocks nobody holds count as free in vLLM's usage).
    assert all(metrics(engine_mesh, w)["vllm:kv_cache_usage_perc"] == 0 for w in WORKERS)


def test_killing_the_serving_worker_mid_stream_is_invisible_at_temperature_0(client, engine_mesh):
    request = {"model": MODEL, "messages": [{"role": "user", "content": "Write a long story about routers."}],
               "max_tokens": 160, "temperature": 0, "extra_body": {"ignore_eos": True}}
    undisturbed = client.chat.completions.create(**request).choices[0].message.content
    # The stream names its worker (nvext.extra_fields): the engines' own "running" gauges are sampled,
    # and a fast engine could be past its last token before a scrape saw it running.
    stream = client.chat.completions.create(**{**request, "extra_body": {
        **request["extra_body"], "nvext": {"extra_fields": ["worker_id"]}}}, stream=True)
    parts, serving = [], []
    for chunk in stream:
        if not serving:
            worker_id = chunk.model_extra["nvext"]["worker_id"]["decode_worker_id"]
            serving = [w for w in WORKERS
                       if f"registering {worker_id} " in (engine_mesh.log_dir / f"{w}.log").read_text(errors="replace")]
            assert len(serving) == 1, (worker_id, serving)
        parts.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
        if len(parts) == 4:  # a few tokens in: a fast CPU engine must not be done yet
            engine_mesh.kill(serving[0], signal.SIGKILL)
    assert "".join(parts) == undisturbed
    engine_mesh.procs[serving[0]].wait(10)


def _children(pid: int) -> list[int]:
    """Every child, whichever of the process's threads started it (vLLM starts its core from one)."""
    return [int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]


def test_a_worker_whose_engine_dies_deregisters_and_exits(engine_mesh, client):
    alive = [w for w in WORKERS if engine_mesh.procs[w].poll() is None]
    assert len(alive) == 1, alive
    worker = engine_mesh.procs[alive[0]]
    cores = [c for c in _children(worker.pid) if "EngineCore" in Path(f"/proc/{c}/cmdline").read_text()
             + Path(f"/proc/{c}/comm").read_text()]
    assert len(cores) == 1, {c: Path(f"/proc/{c}/cmdline").read_text() for c in _children(worker.pid)}
    os.kill(cores[0], signal.SIGKILL)
    assert worker.wait(30) == 1
    assert "the engine died" in engine_mesh.logs(alive[0])
    deadline = time.monotonic() + 5
    while client.models.list().data:
        assert time.monotonic() < deadline, "the model is still listed with no live worker"
        time.sleep(0.1)
