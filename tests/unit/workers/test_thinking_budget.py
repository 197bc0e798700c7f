"""A thinking budget is enforced where the worker's reasoning parser ends thinking at one token, else refused (400).

The hf worker's enforcement on a real model is in tests/service/workers/test_hf_server.py; vLLM's in
tests/engine_env/vllm (its ReasoningConfig) and here (the sampling parameter).
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from services.common.errors import InvalidRequest
from services.workers.convert import engine_error
from services.workers.engine import EngineRequest, RequestRejected
from services.workers.model_dir import load_tokenizer
from services.workers.thinking_budget import ThinkingBudget, ThinkingMarkers, thinking_markers
from services.workers.vllm import sampling as vllm_sampling

pytestmark = pytest.mark.unit

S, E = 7, 8  # the markers' ids in the budget tests
MARKERS = ThinkingMarkers(S, E, "<s>", "</s>")


def run_budget(budget: int, prompt: list[int], model_says: list[int]) -> list[int]:
    """What a decode loop produces with ``budget``: the model's choice unless a token is forced."""
    b = ThinkingBudget(MARKERS, budget, prompt)
    out = []
    for wanted in model_says:
        token = b.forced() or wanted
        b.observe(token)
        out.append(token)
    return out


def test_a_block_the_prompt_opened_closes_after_the_budget_counting_the_prompts_tokens_in_it():
    assert run_budget(3, [1, S, 2], [3, 3, 3, 3, 3]) == [3, 3, E, 3, 3]
    assert run_budget(0, [1, S], [3, 3]) == [E, 3]


def test_a_block_the_model_opens_counts_from_its_opening_marker():
    assert run_budget(2, [1, S, 2, E, 1], [3, S, 4, 4, 4, 4]) == [3, S, 4, 4, E, 4]


def test_a_block_closed_within_the_budget_is_left_alone():
    assert run_budget(5, [S], [4, E, 4, 4, 4, 4, 4]) == [4, E, 4, 4, 4, 4, 4]


def test_markers_are_the_reasoning_parsers_single_tokens(demo_model_dir):
    tokenizer = load_tokenizer(demo_model_dir)
    m = thinking_markers("qwen3", tokenizer)
    assert m.enforceable and (m.start, m.end) == (tokenizer.token_to_id("<think>"), tokenizer.token_to_id("</think>"))
    assert thinking_markers("mistral", tokenizer).why_not == "'[THINK]' is not one token of the model's vocabulary"
    assert "granite" in thinking_markers("granite", tokenizer).why_not
    assert "gpt_oss" in thinking_markers("gpt_oss", tokenizer).why_not
    assert "no reasoning parser" in thinking_markers("", tokenizer).why_not


@pytest.mark.parametrize("parser", ["granite", "", "mistral"])
def test_the_hf_worker_refuses_a_budget_it_cannot_enforce_naming_the_field_and_why(parser, demo_model_dir):
    from services.workers.hf.engine import HfEngine

    engine = HfEngine(str(demo_model_dir), context_length=64,
                      thinking=thinking_markers(parser, load_tokenizer(demo_model_dir)))

    async def first():
        return await anext(engine.generate(EngineRequest(request_id="r", token_ids=[1, 2], max_tokens=4,
                                                         max_thinking_tokens=32)))

    with pytest.raises(RequestRejected) as e:
        asyncio.run(first())  # refused before the model would load
    err = engine_error(e.value)
    assert isinstance(err, InvalidRequest) and err.http_status == 400 and err.param == "nvext.max_thinking_tokens"
    assert engine.thinking.why_not in err.message


def test_vllm_gets_the_budget_where_its_engine_enforces_it_and_refuses_it_elsewhere():
    request = EngineRequest(request_id="r", token_ids=[1, 2, 3], max_tokens=8, max_thinking_tokens=32)
    kwargs = vllm_sampling.sampling_kwargs(request, max_model_len=100, defaults={}, thinking_budgets=True)
    assert kwargs["thinking_token_budget"] == 32
    with pytest.raises(RequestRejected) as e:
        vllm_sampling.sampling_kwargs(request, max_model_len=100, defaults={})
    assert e.value.param == "nvext.max_thinking_tokens" and "end-of-thinking marker" in str(e.value)
    without = dataclasses.replace(request, max_thinking_tokens=None)
    assert "thinking_token_budget" not in vllm_sampling.sampling_kwargs(without, max_model_len=100, defaults={},
                                                                        thinking_budgets=True)
