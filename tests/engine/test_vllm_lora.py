"""A LoRA adapter on a real vLLM worker (CPU build) behind the mesh: the demo model's random PEFT adapter
(services/models/qwen_lora.py) from --lora-modules, and one loaded at runtime through the API.

One worker; vLLM's own offline ``LLM.generate`` with the same ``LoRARequest`` runs meanwhile in another
process, as the reference for the same prompt ids at temperature 0.
"""

from __future__ import annotations

import json
import os
import subprocess

import httpx
import openai
import pytest

from services.launcher.plan import WorkerSpec, ephemeral_plan
from services.launcher.processes import Mesh
from services.launcher.run import VLLM_CPU_FLAGS
from services.models.qwen_lora import DEMO_ADAPTER_NAME, RANK, default_demo_adapter_dir
from tests.conftest import ROOT, sdk_client, stop_cleanly
from tests.engine.conftest import ENGINE_START_S, wait_workers
from tests.engine.test_vllm_mesh import _byte_level_vocab, _token_ids

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

MODEL = "meshfront/demo-qwen"
MESSAGES = [{"role": "user", "content": "Tell me about adapters."}]
N = 12
OFFLINE = (
    "import json, sys\n"
    "from vllm import LLM, SamplingParams\n"
    "from vllm.inputs import TokensPrompt\n"
    "from vllm.lora.request import LoRARequest\n"
    "if __name__ == '__main__':\n"
    "    model_dir, adapter, name, ids, n, rank = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), "
    "int(sys.argv[5]), int(sys.argv[6])\n"
    "    llm = LLM(model=model_dir, max_model_len=4096, gpu_memory_utilization=0.1, enable_lora=True,\n"
    "              max_lora_rank=rank, max_loras=2, enforce_eager=True)\n"
    "    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, detokenize=False)\n"
    "    base = llm.generate(TokensPrompt(prompt_token_ids=ids), params)[0].outputs[0].token_ids\n"
    "    lora = llm.generate(TokensPrompt(prompt_token_ids=ids), params,\n"
    "                        lora_request=LoRARequest(name, 1, adapter))[0].outputs[0].token_ids\n"
    "    print('IDS ' + json.dumps([list(base), list(lora)]), flush=True)\n"
)


@pytest.fixture(scope="module")
def tokenizer(tiny_lm_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_lm_dir)


@pytest.fixture(scope="module")
def offline(vllm_python, tiny_lm_dir, tokenizer):
    """vLLM's offline greedy tokens (base, adapter), started now and read when a test needs them."""
    adapter = default_demo_adapter_dir()
    prompt = list(tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True,
                                                return_dict=False))
    proc = subprocess.Popen([vllm_python, "-c", OFFLINE, str(tiny_lm_dir), str(adapter), DEMO_ADAPTER_NAME,
                             json.dumps(prompt), str(N), str(RANK)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={"VLLM_HOST_IP": "127.0.0.1", "PATH": "/usr/bin:/bin"})
    result: dict[str, list[int]] = {}

    def read() -> dict[str, list[int]]:
        if not result:
            out, err = proc.communicate(timeout=ENGINE_START_S)
            lines = [ln for ln in out.splitlines() if ln.startswith("IDS ")]
            assert proc.returncode == 0 and lines, f"offline vLLM failed (rc {proc.returncode}):\n{err[-3000:]}"
            result["base"], result["lora"] = json.loads(lines[-1][4:])
        return result
    yield read
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def lora_mesh(tmp_path_factory, offline, vllm_python, tiny_lm_dir, envoy_bin, nats_bin):
    adapter = default_demo_adapter_dir()
    flags = (*VLLM_CPU_FLAGS, "--worker-id", "vllm-lora", "--enable-lora", "--max-loras", "2",
             "--max-lora-rank", str(RANK), "--lora-modules", f"{DEMO_ADAPTER_NAME}={adapter}")
    # The CPU engine swapping adapters on a CI machine whose two cores run every tier went more than the
    # postprocessor's default 5 s without a token, and the request was failed as a dead worker's.
    plan = ephemeral_plan([WorkerSpec(str(tiny_lm_dir), MODEL, "vllm", flags)], run_dir=ROOT / ".run" / "tests",
                          service_args={"postprocessor": ("--stream-idle-timeout-s", "60")})
    mesh = Mesh(plan, tmp_path_factory.mktemp("engine-lora-logs"))
    old = os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING")
    os.environ["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"  # vLLM's switch for runtime loading
    try:
        mesh.start(timeout=ENGINE_START_S)
        wait_workers(mesh.url, DEMO_ADAPTER_NAME, 1, timeout=ENGINE_START_S)
    except AssertionError:
        print(mesh.all_logs())
        stop_cleanly(mesh)
        raise
    finally:
        if old is None:
            os.environ.pop("VLLM_ALLOW_RUNTIME_LORA_UPDATING")
        else:
            os.environ["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = old
    yield mesh
    # vLLM logs the traceback of the refused directory (test_runtime_load_and_unload) from its engine core and
    # its worker, each line prefixed, so each line reads as a traceback of its own: the frames of a failed
    # adapter load (the only utility call that fails in this module). A loaded machine can also see vLLM's engine
    # core go before its output handler at shutdown (test_vllm_vision.py).
    stop_cleanly(mesh, expected_tracebacks=("_load_adapter", "_execute_worker_rpc", "_invoke_utility_method",
                                            "No adapter found", "output_handler"))


def greedy_ids(client, tokenizer, model: str) -> list[int]:
    """The mesh's greedy tokens for MESSAGES, read back exactly from the logprobs' bytes."""
    r = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=N, temperature=0, logprobs=True,
                                       extra_body={"ignore_eos": True})
    assert r.model == model and r.usage.completion_tokens == N
    return _token_ids(r.choices[0].logprobs.content, _byte_level_vocab(tokenizer))


def test_adapter_greedy_equals_vllm_offline_and_differs_from_base(lora_mesh, offline, tokenizer):
    client = sdk_client(lora_mesh, timeout=120)
    lora = greedy_ids(client, tokenizer, DEMO_ADAPTER_NAME)
    base = greedy_ids(client, tokenizer, MODEL)
    expected = offline()
    assert base == expected["base"]
    assert lora == expected["lora"]
    assert lora != base


def test_runtime_load_and_unload(lora_mesh, offline, tokenizer):
    client = sdk_client(lora_mesh, timeout=120)
    r = httpx.post(f"{lora_mesh.url}/v1/load_lora_adapter", timeout=120,
                   json={"lora_name": "again", "lora_path": str(default_demo_adapter_dir())})
    assert r.status_code == 200, r.text
    listed = {m.id: m.model_extra for m in client.models.list().data}
    assert listed["again"]["parent"] == MODEL
    assert greedy_ids(client, tokenizer, "again") == offline()["lora"]  # the same weights under another name
    bad = httpx.post(f"{lora_mesh.url}/v1/load_lora_adapter", timeout=120,
                     json={"lora_name": "broken", "lora_path": "/nonexistent/adapter"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "lora_path", bad.text
    assert "No adapter found" in bad.json()["error"]["message"] and "stack trace" not in bad.text
    assert greedy_ids(client, tokenizer, DEMO_ADAPTER_NAME) == offline()["lora"]  # the engine still serves
    r = httpx.post(f"{lora_mesh.url}/v1/unload_lora_adapter", json={"lora_name": "again"}, timeout=120)
    assert r.status_code == 200, r.text
    with pytest.raises(openai.NotFoundError):
        greedy_ids(client, tokenizer, "again")
