"""The engine tier: real vLLM (CPU build) workers behind the whole mesh, driven like a user would.

Slow by nature (the engine environment is created once, about 2.5 minutes; each engine loads in
about a minute), so one mesh serves the module. Under CI=true a missing engine environment is a
failure, never a skip: `make test` prepares it (`make engine-env`) before pytest runs.
"""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.launcher.engine_env import ENGINES, EngineEnvError, ensure
from tests.conftest import IN_CI

pytestmark = pytest.mark.engine

ENGINE_START_S = 420.0
# An engine module's first test waits for its mesh: up to ENGINE_START_S (twice that for two media engines) by the
# fixture's own clock, which says what did not start; pytest's whole-test limit must not cut it short first.
ENGINE_TEST_TIMEOUT_S = ENGINE_START_S * 2 + 60


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # (A hook in this conftest sees every collected item, not only this directory's.)
    here = Path(__file__).parent
    for item in items:
        if item.path.is_relative_to(here) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(ENGINE_TEST_TIMEOUT_S))


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


class OfflineVLLM:
    """vLLM's own offline ``LLM.generate`` on the demo model at temperature 0, in a process of its own that loads
    the engine once for the whole session (each load costs a minute here) and answers one request per line."""

    SCRIPT = (
        "import json, sys\n"
        "from vllm import LLM, SamplingParams\n"
        "from vllm.inputs import TokensPrompt\n"
        "if __name__ == '__main__':\n"
        # No prefix caching: each answer is computed from its prompt alone, whatever was asked before it.
        "    llm = LLM(model=sys.argv[1], max_model_len=4096, gpu_memory_utilization=0.1, enforce_eager=True,\n"
        "              enable_prefix_caching=False)\n"
        "    print('READY', flush=True)\n"
        "    for line in sys.stdin:\n"
        "        ids, n = json.loads(line)\n"
        "        out = llm.generate(TokensPrompt(prompt_token_ids=ids), SamplingParams(temperature=0, max_tokens=n,\n"
        "                           ignore_eos=True, detokenize=False, logprobs=0), use_tqdm=False)[0].outputs[0]\n"
        "        lps = [position[i].logprob for i, position in zip(out.token_ids, out.logprobs)]\n"
        "        print('IDS ' + json.dumps([list(out.token_ids), lps]), flush=True)\n"
    )

    def __init__(self, python: str, model_dir: str, log: Path):
        self.log = log
        # Its stderr (vLLM's log) goes to a file: a pipe nobody reads would fill and stall the engine.
        with open(log, "wb") as err:
            self.proc = subprocess.Popen([python, "-c", self.SCRIPT, model_dir], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=err, text=True,
                                         env={"VLLM_HOST_IP": "127.0.0.1", "PATH": "/usr/bin:/bin"})
        self.ready = False
        self.lines: queue.Queue[str] = queue.Queue()  # its stdout, line by line (vLLM may print more than ours)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put("")  # it exited

    def _line(self, timeout: float) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            line = ""
        assert line, (f"offline vLLM {'exited ' + str(self.proc.poll()) if self.proc.poll() is not None else 'hung'}"
                      f":\n{self.log.read_text()[-3000:]}")
        return line

    def generate(self, prompt_ids: list[int], max_tokens: int) -> tuple[list[int], list[float]]:
        """Greedy token ids and each one's log probability."""
        while not self.ready:
            self.ready = self._line(ENGINE_START_S).strip() == "READY"
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps([prompt_ids, max_tokens]) + "\n")
        self.proc.stdin.flush()
        line = self._line(120)
        while not line.startswith("IDS "):
            line = self._line(120)
        ids, logprobs = json.loads(line[4:])
        return ids, logprobs

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()  # its loop ends and vLLM shuts down
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="session")
def offline_vllm(vllm_python, tiny_lm_dir, tmp_path_factory) -> Iterator[OfflineVLLM]:
    """Started when the first module asks for it, so it loads while that module's mesh starts."""
    engine = OfflineVLLM(vllm_python, str(tiny_lm_dir), tmp_path_factory.mktemp("offline-vllm") / "vllm.log")
    yield engine
    engine.close()
