"""`meshfront run --demo-audio`: one more worker serving the demo audio model, mocker or vLLM."""

from __future__ import annotations

import json
import pathlib

import pytest

from services.launcher.media_demos import AUDIO
from services.launcher.run import VLLM_CPU_ARGS, _placement, parse_args
from services.models.build import REPO_ROOT
from services.models.qwen_audio import NAME

pytestmark = pytest.mark.unit

BUILD = REPO_ROOT / "build" / "models"


def test_no_audio_worker_without_the_flag():
    assert AUDIO.workers(parse_args([]), BUILD, VLLM_CPU_ARGS) == []


def test_the_mocker_serves_it_by_default_declaring_audio():
    args = parse_args(["--demo-audio"])
    [spec] = AUDIO.workers(args, BUILD, VLLM_CPU_ARGS)
    assert (spec.kind, spec.model_name) == ("mocker", NAME)
    assert spec.extra[spec.extra.index("--input-modalities") + 1] == "audio"
    config = json.loads((pathlib.Path(spec.model_dir) / "config.json").read_text())
    assert config["architectures"] == ["Qwen2AudioForConditionalGeneration"]
    # ... on a port of its own, beside the vision demo's when both are asked for.
    assert len(_placement(args)["worker_ports"]) == len(_placement(parse_args([]))["worker_ports"]) + 1
    both = parse_args(["--demo-audio", "--demo-vision"])
    assert len(_placement(both)["worker_ports"]) == len(_placement(parse_args([]))["worker_ports"]) + 2


def test_worker_kind_vllm_runs_it_in_vllm_with_one_clip_a_prompt():
    args = parse_args(["--demo-audio", "--worker-kind", "vllm", "--engine-args", "--max-model-len 2048"])
    [spec] = AUDIO.workers(args, BUILD, VLLM_CPU_ARGS)
    assert spec.kind == "vllm" and "--input-modalities" not in spec.extra  # vLLM's model config says
    assert spec.extra[:2] == ("--max-model-len", "2048")
    assert spec.extra[2:2 + len(AUDIO.vllm_args)] == AUDIO.vllm_args
    assert json.loads(AUDIO.vllm_args[AUDIO.vllm_args.index("--limit-mm-per-prompt") + 1]) == {"audio": 1}
    assert (pathlib.Path(spec.model_dir) / "model.safetensors").is_file()


def test_the_hf_worker_cannot_serve_it(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--demo-audio", "--worker-kind", "hf"])
    assert "--demo-audio runs on the mocker or vllm" in capsys.readouterr().err
