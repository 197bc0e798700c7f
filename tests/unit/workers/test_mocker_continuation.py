"""A migrated request continues exactly: the mocker's default output is chained on the whole context, and
script mode finds how far into its answer the continuation's prompt already is."""

from __future__ import annotations

import json

import pytest

from services.workers.mocker.outputs import OutputPolicy, chain_state
from tests.conftest import MOCKER_SCRIPT

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


# -- script mode: a continuation goes on with the scripted answer instead of starting it over ----------

EOS = 151645


def chat_prompt(tokenizer, *turns: str) -> list[int]:
    """Alternating user / assistant turns in the demo model's template, ending with the assistant's header."""
    text = "".join(f"<|im_start|>{'user' if i % 2 == 0 else 'assistant'}\n{t}<|im_end|>\n" for i, t in enumerate(turns))
    return tokenizer.encode(text + "<|im_start|>assistant\n", add_special_tokens=False).ids


def run(policy, prompt, *, max_tokens, min_tokens=0, eos_id=EOS, ignore_eos=False, budget=None):
    plan = policy.plan(prompt, seed=7, max_tokens=max_tokens, min_tokens=min_tokens, eos_id=eos_id,
                       ignore_eos=ignore_eos, max_thinking_tokens=budget)
    out = []
    for i in range(max_tokens):
        token, finish = plan.token_at(i)
        out.append(token)
        if finish:
            return out, finish
    raise AssertionError("the plan never finished")


def migrated(policy, prompt, full, split, *, max_tokens, min_tokens=0, **kw):
    """What the postprocessor's continuation gets after ``split`` tokens (services/postprocessor/migration.py)."""
    out, finish = run(policy, prompt + full[:split], max_tokens=max(1, max_tokens - split),
                      min_tokens=max(0, min_tokens - split), **kw)
    return full[:split] + out, finish


@pytest.fixture(scope="module")
def golden(tokenizer):
    return OutputPolicy.build(tokenizer, script_path=MOCKER_SCRIPT)


@pytest.mark.parametrize(("ask", "options"), [
    ("Tell me a story", {"max_tokens": 200}),  # the answer, then EOS
    ("Count to ten", {"max_tokens": 200, "min_tokens": 25}),  # padded before EOS
    ("Count to ten", {"max_tokens": 40, "eos_id": None, "ignore_eos": True}),  # pseudo-random tokens after it
    ("Tell me a story", {"max_tokens": 12}),  # cut by max_tokens
    ("What is 2+2", {"max_tokens": 200, "budget": 3}),  # a thinking budget shortened the answer
])
def test_a_scripted_answer_migrated_at_any_token_is_the_undisturbed_one(golden, tokenizer, ask, options):
    prompt = chat_prompt(tokenizer, ask)
    full, finish = run(golden, prompt, **options)
    for split in range(1, len(full)):
        assert migrated(golden, prompt, full, split, **options) == (full, finish), f"split at {split}"


def test_a_continuation_is_not_misled_by_a_match_string_inside_the_answer(tokenizer, tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps([{"match": "weather", "text": "Ask me about the capital instead, please."},
                                {"match": "capital", "text": "Paris."}]))
    policy = OutputPolicy.build(tokenizer, script_path=path)
    prompt = chat_prompt(tokenizer, "How is the weather?")
    full, finish = run(policy, prompt, max_tokens=100)
    assert tokenizer.decode(full[:-1]) == "Ask me about the capital instead, please."
    for split in range(1, len(full)):
        assert migrated(policy, prompt, full, split, max_tokens=100) == (full, finish), f"split at {split}"


def test_an_earlier_turn_holding_the_answer_is_no_continuation(golden, tokenizer):
    first = chat_prompt(tokenizer, "Count to ten")
    answer, _ = run(golden, first, max_tokens=100)
    again = chat_prompt(tokenizer, "Count to ten", tokenizer.decode(answer[:-1]), "Count to ten")
    assert run(golden, again, max_tokens=100)[0] == answer
