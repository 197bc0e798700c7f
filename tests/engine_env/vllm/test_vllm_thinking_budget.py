"""The thinking budget on vLLM: the worker's reasoning parser becomes vLLM's own ReasoningConfig, whose marker
ids vLLM's sampler forces the end of thinking with (services/workers/vllm/thinking_budget.py)."""

from __future__ import annotations

import pytest
from vllm.config.reasoning import ReasoningConfig

from services.workers.engine import EngineRequest, RequestRejected
from services.workers.model_dir import load_tokenizer
from services.workers.vllm import thinking_budget
from services.workers.vllm.config import parse_config
from services.workers.vllm.engine import sampling_params


def engine_args(model_dir, *flags):
    return parse_config(["--model-dir", str(model_dir), "--no-register", *flags], env={}).engine_args()


def test_the_workers_reasoning_parser_gives_vllm_the_marker_ids_it_forces(demo_model_dir):
    args = engine_args(demo_model_dir, "--reasoning-parser", "qwen3")
    config = args.reasoning_config
    assert (config.reasoning_start_str, config.reasoning_end_str) == ("<think>", "</think>")
    assert not config.reasoning_parser  # vLLM's --reasoning-parser would also delay guided decoding
    config.initialize_token_ids(args.create_model_config())
    tokenizer = load_tokenizer(demo_model_dir)
    assert config.reasoning_end_token_ids == [tokenizer.token_to_id("</think>")]
    assert config.reasoning_start_token_ids == [tokenizer.token_to_id("<think>")]
    assert thinking_budget.enforces(type("VllmConfig", (), {"reasoning_config": config}))


@pytest.mark.parametrize("flags", [(), ("--reasoning-parser", "granite"), ("--reasoning-parser", "mistral")])
def test_without_single_token_markers_vllm_gets_no_reasoning_config(demo_model_dir, flags):
    assert engine_args(demo_model_dir, *flags).reasoning_config is None


def test_a_reasoning_config_given_to_vllm_is_kept(demo_model_dir):
    args = engine_args(demo_model_dir, "--reasoning-parser", "qwen3", "--reasoning-config",
                       '{"reasoning_start_str": "<think>", "reasoning_end_str": "Enough.</think>"}')
    assert isinstance(args.reasoning_config, ReasoningConfig)
    assert args.reasoning_config.reasoning_end_str == "Enough.</think>"


def test_the_budget_is_vllms_thinking_token_budget_where_enforced_and_a_400_elsewhere():
    request = EngineRequest(request_id="r", token_ids=[1, 2, 3], max_thinking_tokens=5)
    assert sampling_params(request, max_model_len=100, defaults={}, thinking_budgets=True).thinking_token_budget == 5
    with pytest.raises(RequestRejected) as e:
        sampling_params(request, max_model_len=100, defaults={})
    assert e.value.param == "nvext.max_thinking_tokens"
