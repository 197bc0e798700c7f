"""The vLLM worker process on its own: what an operator sees when the engine cannot start."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.engine


def test_an_unsupported_architecture_exits_1_with_vllms_message_on_one_line(vllm_python, tiny_lm_dir, tmp_path):
    bad = tmp_path / "bad-model"
    shutil.copytree(tiny_lm_dir, bad)
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "architectures": ["NopeForCausalLM"]}))
    proc = subprocess.run([vllm_python, "-m", "services.workers.vllm", "--model-dir", str(bad), "--no-register",
                           "--gpu-memory-utilization", "0.1"], capture_output=True, text=True, timeout=300,
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
