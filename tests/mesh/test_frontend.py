"""`meshfront frontend`: Dynamo's launch lines serve the workers a `meshfront run` registered (issue 36).

One `meshfront run` (real launcher: NATS, two mocker workers and its own frontend tier) is where the workers
come from. Each test starts `meshfront frontend` as a user would, with Dynamo's flags or `DYN_*` variables,
against that NATS, and drives it with the official clients: the seed's launch line with only the program
name changed (KServe off, as in Dynamo), the env-var form with the KServe switch, `--split` with preprocess
workers, `-i`, and a static model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

from services.launcher.plan import free_port
from tests.conftest import BIN, ROOT
from tests.mesh.conftest import DEMO
from tests.mesh.test_launcher_supervision import Launcher, _starttime, descendants

pytestmark = pytest.mark.mesh


def frontend_argv() -> list[str]:
    exe = BIN / "meshfront"
    return [str(exe), "frontend"] if exe.exists() else [
        sys.executable, "-c", "import sys; from services.cli import main; main(['frontend', *sys.argv[1:]])"]


class Frontend:
    """``meshfront frontend`` in its own session, its output in a file."""

    def __init__(self, tmp: pathlib.Path, *flags: str, env: dict[str, str] | None = None,
                 stdin: int | None = subprocess.DEVNULL):
        self.log_path = tmp / f"frontend-{time.monotonic_ns()}.log"
        log = open(self.log_path, "wb")  # noqa: SIM115 - closed right after the start
        self.proc = subprocess.Popen([*frontend_argv(), *flags], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=stdin, start_new_session=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        log.close()
        self.seen: dict[int, str] = {}

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_serving(self, url: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"meshfront frontend exited\n{self.log()[-4000:]}"
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                r = httpx.get(f"{url}/v1/models", timeout=2)
                if r.status_code == 200 and DEMO in {m["id"] for m in r.json()["data"]}:
                    self.seen.update(descendants(self.proc.pid))
                    return
            time.sleep(0.3)
        raise AssertionError(f"the frontend did not list {DEMO} in {timeout} s\n{self.log()[-4000:]}")

    def stop(self) -> int:
        """SIGINT, as Ctrl-C: the frontend stops every process it started and exits 0."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGINT)
        try:
            return self.proc.wait(30)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)


@dataclasses.dataclass(frozen=True)
class Workers:
    nats_url: str  # where every frontend here finds the workers
    run_url: str  # meshfront run's own edge: the workers' published model files render there


@pytest.fixture(scope="module")
def workers(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    """`meshfront run`'s mesh: its NATS and its two mocker workers are what every frontend here finds."""
    tmp = tmp_path_factory.mktemp("frontend-workers")
    nats_port = free_port()
    lch = Launcher(tmp, "--model-dir", str(demo_model_dir), "--model-name", DEMO, "--nats-port", str(nats_port),
                   "--embedding-workers", "0", "--image-workers", "0", "--video-workers", "0", "--speedup-ratio", "0")
    try:
        lch.wait_healthy(2, 120)
        yield Workers(f"nats://127.0.0.1:{nats_port}", lch.url)
    finally:
        lch.kill_everything()


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    return ""


def _chat(url: str) -> openai.types.chat.ChatCompletion:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=30)
    return client.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": "hello"}], max_tokens=8)


def test_the_seeds_launch_line_with_only_the_program_name_changed(workers, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    dump = tmp_path / "config.json"
    fe = Frontend(tmp_path, "--http-port", str(port), "--router-mode", "kv", "--dump-config-to", str(dump),
                  "--frontend-route-extension", "examples.route_extension.status_routes:routes",
                  env={"NATS_SERVER": workers.nats_url, "PYTHONPATH": str(ROOT)})
    try:
        fe.wait_serving(url)
        answer = _chat(url)
        assert answer.choices[0].message.content and answer.usage.completion_tokens > 0
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=30)
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model=DEMO, messages=[{"role": "user", "content": "hello"}], max_tokens=8, stream=True) if c.choices)
        assert streamed
        # The route extension example, served through Envoy like a built-in route.
        status = httpx.get(f"{url}/example/status", headers={"x-request-id": "ext-1"}, timeout=10)
        assert status.status_code == 200 and status.json()["request_id"] == "ext-1", status.text
        assert DEMO in status.json()["models"]
        settings = json.loads(dump.read_text())["settings"]
        assert settings["router_mode"] == {"value": "kv", "source": "flag", "flag": "--router-mode",
                                           "owner": "router"}
        assert settings["nats_url"]["source"] == "env NATS_SERVER"
        # Dynamo's defaults: its metric names, and no Anthropic API unless asked.
        assert "dynamo_frontend_requests_total" in httpx.get(f"{url}/metrics", timeout=5).text
        assert httpx.post(f"{url}/v1/messages", json={"model": DEMO, "max_tokens": 4, "messages": [
            {"role": "user", "content": "hi"}]}, timeout=10).status_code == 404
        client = triton.InferenceServerClient(f"127.0.0.1:{port}")  # KServe is off unless switched on, as in Dynamo
        with pytest.raises(InferenceServerException, match="kserve-grpc-server"):
            client.infer(DEMO, [triton.InferInput("text_input", [1], "BYTES").set_data_from_numpy(
                np.array([b"hi"], dtype=object))])
    finally:
        assert fe.stop() == 0, fe.log()[-3000:]
    assert not [pid for pid, start in fe.seen.items() if _starttime(pid) == start]  # it stopped all it started


def test_dynamo_env_vars_and_the_kserve_switch_in_the_split_shape(workers, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    fe = Frontend(tmp_path, "--kserve-grpc-server", "--split", "--dyn-preprocess-workers", "2",
                  "--grpc-metrics-port", "0",
                  env={"DYN_HTTP_PORT": str(port), "DYN_ROUTER_MODE": "kv", "NATS_SERVER": workers.nats_url})
    try:
        fe.wait_serving(url)
        assert _chat(url).choices[0].message.content
        client = triton.InferenceServerClient(f"127.0.0.1:{port}")
        assert client.is_model_ready(DEMO)
        cmdlines = [_cmdline(pid) for pid in fe.seen]
        assert sum("services.preprocessor" in c for c in cmdlines) == 2, cmdlines  # --dyn-preprocess-workers 2
    finally:
        assert fe.stop() == 0, fe.log()[-3000:]


def test_interactive_chat_streams_keeps_the_conversation_and_ends_on_exit(workers, tmp_path):
    port = free_port()
    fe = Frontend(tmp_path, "-i", "--http-port", str(port), "--model-name", DEMO, env={"NATS_SERVER": workers.nats_url},
                  stdin=subprocess.PIPE)
    assert fe.proc.stdin is not None
    fe.proc.stdin.write(b"hello\nwhat did I say?\n/exit\n")
    fe.proc.stdin.close()
    try:
        assert fe.proc.wait(120) == 0, fe.log()[-3000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(fe.proc.pid, signal.SIGKILL)
    out = fe.log()
    assert f"chatting with {DEMO}" in out
    turns = [line for line in out.splitlines() if line.startswith("> ")]
    assert len(turns) >= 3 and all(len(t) > 2 for t in turns[:2]), out[-3000:]  # two answers streamed
    assert "[error]" not in out


def test_a_static_model_reads_its_files_from_model_path_not_from_the_workers_cards(workers, tmp_path,
                                                                                   demo_model_dir):
    # The same model with a chat template that puts a long system line first: the frontend must render with
    # this directory's template, not with the one the workers published (the workers' edge renders theirs).
    static_dir = tmp_path / "static-model"
    shutil.copytree(demo_model_dir, static_dir, ignore=shutil.ignore_patterns("*.safetensors"))
    template = static_dir / "chat_template.jinja"
    template.write_text("STATIC MODEL PATH TEMPLATE " * 10 + template.read_text())
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    fe = Frontend(tmp_path, "--http-port", str(port), "--model-name", DEMO, "--model-path", str(static_dir),
                  "--kv-cache-block-size", "32", env={"NATS_SERVER": workers.nats_url})
    try:
        fe.wait_serving(url)
        static_prompt = _chat(url).usage.prompt_tokens
    finally:
        assert fe.stop() == 0, fe.log()[-3000:]
    published_prompt = _chat(workers.run_url).usage.prompt_tokens  # the run's edge renders the published files
    assert static_prompt >= published_prompt + 40, (static_prompt, published_prompt)
