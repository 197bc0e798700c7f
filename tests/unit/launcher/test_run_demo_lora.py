"""`meshfront run --demo-lora`: the demo adapter's flags are valid worker command lines for the mocker and
vLLM, and the shapes it cannot serve are refused before anything starts."""

from __future__ import annotations

import os

import pytest

from services.launcher.demo_lora import demo_lora_flags
from services.launcher.run import parse_args
from services.models.qwen_lora import DEMO_ADAPTER_NAME, RANK
from services.workers.mocker.config import parse_config as parse_mocker
from services.workers.vllm.config import parse_config as parse_vllm

pytestmark = pytest.mark.unit


def test_demo_lora_flags_make_the_adapter_a_module_of_each_worker_kind(demo_model_dir, monkeypatch):
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "0")  # recorded, so the test's change is undone
    monkeypatch.delenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING")
    mocker = parse_mocker(["--model-dir", str(demo_model_dir), *demo_lora_flags("mocker")], env={})
    assert mocker.lora.enabled and mocker.lora.runtime_loading
    [adapter] = mocker.lora.modules
    assert adapter.name == DEMO_ADAPTER_NAME
    vllm = parse_vllm(["--model-dir", str(demo_model_dir), *demo_lora_flags("vllm")], env={})
    assert [a.name for a in vllm.lora_modules] == [DEMO_ADAPTER_NAME]
    assert "--enable-lora" in vllm.engine_argv and str(RANK) in vllm.engine_argv
    assert os.environ["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"  # the workers inherit the switch


@pytest.mark.parametrize("argv", [["--demo-lora", "--worker-kind", "hf"], ["--demo-lora", "--model-dir", "/m"]])
def test_shapes_the_demo_adapter_cannot_serve_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert "--demo-lora" in capsys.readouterr().err
