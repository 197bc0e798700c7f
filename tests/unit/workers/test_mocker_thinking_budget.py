"""The mocker honours nvext.max_thinking_tokens: a scripted thinking block is cut to the budget and closed."""

from __future__ import annotations

import pytest

from services.workers.mocker.outputs import OutputPolicy

pytestmark = pytest.mark.unit

ANSWER = "<think>\nTwo plus two is four, said the careful model.\n</think>\n\n2 + 2 = 4."


def text(policy: OutputPolicy, tokenizer, budget: int | None) -> str:
    plan = policy.plan([1000, 1001], seed=None, max_tokens=200, eos_id=151645, max_thinking_tokens=budget)
    ids = []
    for i in range(200):
        token, finish = plan.token_at(i)
        if finish.name == "EOS":
            break
        ids.append(token)
    return tokenizer.decode(ids, skip_special_tokens=False)


def test_a_budget_cuts_the_thinking_block(tokenizer):
    policy = OutputPolicy.build(tokenizer, output_text=ANSWER)
    assert text(policy, tokenizer, None) == ANSWER
    assert text(policy, tokenizer, 100) == ANSWER
    thinking = tokenizer.encode("\nTwo plus two is four, said the careful model.\n", add_special_tokens=False).ids
    cut = text(policy, tokenizer, 3)
    assert cut == "<think>" + tokenizer.decode(thinking[:3]) + "</think>\n\n2 + 2 = 4."
    assert text(policy, tokenizer, 0) == "<think></think>\n\n2 + 2 = 4."
    plain = OutputPolicy.build(tokenizer, output_text="no thinking here")
    assert text(plain, tokenizer, 1) == "no thinking here"
