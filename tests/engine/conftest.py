"""The engine tier: real vLLM (CPU build) workers behind the whole mesh, driven like a user would.

Slow by nature (the engine environment is created once, about 2.5 minutes; each engine loads in
about a minute), so one mesh serves the module. Under CI=true a missing engine environment is a
failure, never a skip: `make test` prepares it (`make engine-env`) before pytest runs.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request

import pytest

from services.launcher.engine_env import ENGINES, EngineEnvError, ensure
from tests.conftest import IN_CI

pytestmark = pytest.mark.engine

ENGINE_START_S = 420.0


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The vLLM environment's python (created here when `make engine-env` has not run)."""
    if not ENGINES["vllm"].is_ready() and not IN_CI:
        pytest.skip("the vLLM engine environment is not prepared (make engine-env, about 2.5 minutes)")
    try:
        return str(ensure("vllm", say=lambda line: print(line, flush=True)))
    except EngineEnvError as e:
        pytest.fail(f"cannot prepare the vLLM engine environment: {e}", pytrace=False)


@pytest.fixture(scope="session")
def tiny_lm_dir():
    """The demo model with its tiny random weights (head_dim 64, as vLLM's CPU attention needs)."""
    from services.models.build import default_test_model_dir

    return default_test_model_dir(with_weights=True)


def scrape(port: int) -> dict[str, float]:
    """A Prometheus endpoint's samples (name{labels} -> value), summed over labels per name."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        name = name_labels.split("{", 1)[0]
        out[name] = out.get(name, 0.0) + float(value)
    return out


def health(url: str) -> dict:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        return json.loads(e.read())


def wait_workers(url: str, model: str, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if health(url).get("models", {}).get(model, 0) == count:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{model} did not reach {count} live workers in {timeout:.0f} s: {health(url)}")


def offline_generate(python: str, model_dir: str, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """vLLM's own offline LLM.generate at temperature 0 on the same token ids (a separate process)."""
    return offline_generate_logprobs(python, model_dir, prompt_ids, max_tokens)[0]


def offline_generate_logprobs(python: str, model_dir: str, prompt_ids: list[int],
                              max_tokens: int) -> tuple[list[int], list[float]]:
    """``offline_generate``'s token ids and each one's log probability."""
    script = (
        "import json, sys\n"
        "from vllm import LLM, SamplingParams\n"
        "from vllm.inputs import TokensPrompt\n"
        "if __name__ == '__main__':\n"
        "    model_dir, ids, n = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])\n"
        "    llm = LLM(model=model_dir, max_model_len=4096, gpu_memory_utilization=0.1, enforce_eager=True)\n"
        "    out = llm.generate(TokensPrompt(prompt_token_ids=ids), SamplingParams(\n"
        "        temperature=0, max_tokens=n, ignore_eos=True, detokenize=False, logprobs=0))[0].outputs[0]\n"
        "    lps = [position[i].logprob for i, position in zip(out.token_ids, out.logprobs)]\n"
        "    print('IDS ' + json.dumps([list(out.token_ids), lps]), flush=True)\n"
    )
    proc = subprocess.run([python, "-c", script, model_dir, json.dumps(prompt_ids), str(max_tokens)],
                          capture_output=True, text=True, timeout=ENGINE_START_S,
                          env={"VLLM_HOST_IP": "127.0.0.1", "PATH": "/usr/bin:/bin"})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("IDS ")]
    assert proc.returncode == 0 and lines, f"offline vLLM failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    ids, logprobs = json.loads(lines[-1][4:])
    return ids, logprobs
