"""SGLang 0.5.23's diffusion runtime itself (DiffGenerator, its scheduler process, its diffusers backend) behind
the adapter, on a CPU, with the tiny Stable Diffusion pipeline built in code: the check a GPU day runs
(tools/gpu_media_check.py), here on SGLang's CPU platform. About a minute: the scheduler's start is most of it.

It proves what the class checks cannot: that SGLang accepts the adapter's kwargs end to end and hands back
frames of the asked size; that the same seed gives the same pixels through SGLang; that a cancel after the
first output's progress stops the request before the second output. SGLang's own CUDA kernels and native
model classes are a GPU day's (docs/engines.md, "Media engines").
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from services.models.tiny_diffusion import build_tiny_diffusion

RUNNER = Path(__file__).with_name("with_torchvision_stub.py")
CHECK = Path(__file__).resolve().parents[3] / "tools" / "gpu_media_check.py"


@pytest.fixture(scope="module")
def check_lines(tmp_path_factory) -> list[dict]:
    # Its own copy: built with this environment's diffusers, which is not the mesh's.
    model_dir = build_tiny_diffusion(tmp_path_factory.mktemp("tiny-diffusion")) / "text-to-image"
    proc = subprocess.run([sys.executable, str(RUNNER), str(CHECK), "--engine", "sglang-diffusion",
                           "--model-dir", str(model_dir)], capture_output=True, text=True, timeout=600)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return lines


def test_sglang_makes_two_distinct_images_of_the_asked_size(check_lines):
    (line,) = [x for x in check_lines if x.get("check") == "n=2 at 64x48"]
    assert line["ok"] and line["sizes"] == [[64, 48], [64, 48]], line


def test_the_same_seed_gives_the_same_pixels_through_sglang(check_lines):
    (line,) = [x for x in check_lines if x.get("check") == "same seed, same pixels"]
    assert line["ok"], line


def test_a_cancel_stops_before_the_second_output(check_lines):
    (line,) = [x for x in check_lines if x.get("check") == "cancel after output 0"]
    assert line["ok"] and line["outputs"] == 1, line
