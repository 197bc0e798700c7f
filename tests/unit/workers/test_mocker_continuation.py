"""The mocker's default output is chained on the whole context, so a migrated request continues exactly."""

from __future__ import annotations

import pytest

from services.workers.mocker.outputs import OutputPolicy, chain_state

pytestmark = pytest.mark.unit


def tokens(policy, prompt, seed, n):
    plan = policy.plan(prompt, seed=seed, max_tokens=n)
    return [plan.token_at(i)[0] for i in range(n)]


@pytest.mark.parametrize("split", [0, 1, 17, 63, 64, 99])
def test_a_continuation_produces_the_rest_of_the_undisturbed_output(split):
    policy = OutputPolicy(list(range(1000, 30000)))
    prompt = [11, 12, 13, 14, 15]
    full = tokens(policy, prompt, 3, 100)
    assert tokens(policy, prompt + full[:split], 3, 100 - split) == full[split:]


def test_seed_and_prompt_both_change_the_output():
    policy = OutputPolicy(list(range(1000, 30000)))
    base = tokens(policy, [1, 2, 3], 0, 20)
    assert tokens(policy, [1, 2, 3], 1, 20) != base
    assert tokens(policy, [1, 2, 4], 0, 20) != base
    assert tokens(policy, [1, 2, 3], 0, 20) == base


def test_chain_state_composes():
    assert chain_state([1, 2, 3, 4], 9) == chain_state([3, 4], chain_state([1, 2], 9))
