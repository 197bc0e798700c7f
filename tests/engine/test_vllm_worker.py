"""The vLLM worker process on its own: what an operator sees when the engine cannot start."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from services.launcher.run import VLLM_CPU_FLAGS
from services.workers.engine_worker import descendants

pytestmark = pytest.mark.engine


def test_an_unsupported_architecture_exits_1_with_vllms_message_on_one_line(vllm_python, tiny_lm_dir, tmp_path):
    bad = tmp_path / "bad-model"
    shutil.copytree(tiny_lm_dir, bad)
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "architectures": ["NopeForCausalLM"]}))
    proc = subprocess.run([vllm_python, "-m", "services.workers.vllm", "--model-dir", str(bad), "--no-register",
                           *VLLM_CPU_FLAGS], capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "VLLM_HOST_IP": "127.0.0.1"})
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("vllm: the engine failed to start: ") and "NopeForCausalLM" in last, last
    assert len(last) < 800 and "READY" not in proc.stdout  # it never served, so it never registered


def test_a_flag_vllm_does_not_know_is_refused_by_vllms_parser(vllm_python, tiny_lm_dir):
    proc = subprocess.run([vllm_python, "-m", "services.workers.vllm", "--model-dir", str(tiny_lm_dir),
                           "--no-register", "--tensor-paralel-size", "2"], capture_output=True, text=True,
                          timeout=300, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode != 0 and "--tensor-paralel-size" in proc.stderr, proc.stderr[-2000:]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def test_sigterm_while_the_engine_loads_stops_the_engine_processes_too(vllm_python, tiny_lm_dir):
    proc = subprocess.Popen([vllm_python, "-m", "services.workers.vllm", "--model-dir", str(tiny_lm_dir),
                             "--no-register", *VLLM_CPU_FLAGS], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={"PATH": "/usr/bin:/bin", "VLLM_HOST_IP": "127.0.0.1"},
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not any("EngineCore" in Path(f"/proc/{c}/cmdline").read_text(errors="replace")
                      for c in descendants(proc.pid) if _alive(c)):
            assert proc.poll() is None and time.monotonic() < deadline, "the engine core never started"
            time.sleep(0.2)
        children = descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) != 0
        deadline = time.monotonic() + 10
        while any(_alive(c) for c in children):
            assert time.monotonic() < deadline, [c for c in children if _alive(c)]
            time.sleep(0.1)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
