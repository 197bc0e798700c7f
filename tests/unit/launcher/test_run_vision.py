"""`meshfront run --demo-vision`: one more worker serving the demo vision model, mocker or vLLM."""

from __future__ import annotations

import json
import pathlib

import pytest

from services.launcher.media_demos import VISION
from services.launcher.run import VLLM_CPU_ARGS, _placement, parse_args
from services.models.build import REPO_ROOT
from services.models.qwen_vl import NAME

pytestmark = pytest.mark.unit

BUILD = REPO_ROOT / "build" / "models"


def test_no_vision_worker_without_the_flag():
    args = parse_args([])
    assert VISION.workers(args, BUILD, VLLM_CPU_ARGS) == []


def test_the_mocker_serves_it_by_default_declaring_images_and_videos():
    args = parse_args(["--demo-vision"])
    [spec] = VISION.workers(args, BUILD, VLLM_CPU_ARGS)
    assert (spec.kind, spec.model_name) == ("mocker", NAME)
    assert spec.extra[spec.extra.index("--input-modalities") + 1] == "image,video"
    config = json.loads((pathlib.Path(spec.model_dir) / "config.json").read_text())
    assert config["architectures"] == ["Qwen2VLForConditionalGeneration"]
    # ... on a port of its own.
    assert len(_placement(args)["worker_ports"]) == len(_placement(parse_args([]))["worker_ports"]) + 1


def test_worker_kind_vllm_runs_it_in_vllm_with_images_and_a_video():
    args = parse_args(["--demo-vision", "--worker-kind", "vllm", "--engine-args", "--max-model-len 2048"])
    [spec] = VISION.workers(args, BUILD, VLLM_CPU_ARGS)
    assert spec.kind == "vllm" and "--input-modalities" not in spec.extra  # vLLM's model config says
    assert spec.extra[:2] == ("--max-model-len", "2048")
    assert spec.extra[2:2 + len(VISION.vllm_args)] == VISION.vllm_args
    limits = json.loads(VISION.vllm_args[VISION.vllm_args.index("--limit-mm-per-prompt") + 1])
    assert limits == {"image": 4, "video": 1}


def test_the_hf_worker_cannot_serve_it(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--demo-vision", "--worker-kind", "hf"])
    assert "--demo-vision runs on the mocker or vllm" in capsys.readouterr().err
