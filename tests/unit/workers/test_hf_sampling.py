"""The hf worker's token selection on hand-made logits (torch, no model)."""

from __future__ import annotations

import math

import pytest

from services.workers.engine import SamplingParams
from tests.conftest import require_module

torch = require_module("torch")
from services.workers.hf.sampling import TokenHistory, filter_logits, pick_token  # noqa: E402

pytestmark = pytest.mark.unit

LOGITS = torch.tensor([0.0, 3.0, 1.0, 2.9, -1.0])


def sample_many(params: SamplingParams, n: int = 300, seed: int = 0, **kw) -> set[int]:
    g = torch.Generator().manual_seed(seed)
    return {pick_token(LOGITS, params, generator=g, **kw)[0] for _ in range(n)}


def test_temperature_zero_is_greedy():
    assert pick_token(LOGITS, SamplingParams(temperature=0.0))[0] == 1


def test_banned_ids_are_never_chosen():
    assert pick_token(LOGITS, SamplingParams(temperature=0.0), banned=[1])[0] == 3
    assert 1 not in sample_many(SamplingParams(temperature=1.0), banned=[1, 99])


def test_top_k_and_top_p_narrow_the_choice():
    assert sample_many(SamplingParams(temperature=1.0, top_k=2)) == {1, 3}
    assert sample_many(SamplingParams(temperature=1.0, top_p=0.01)) == {1}
    assert sample_many(SamplingParams(temperature=1.0, min_p=0.5)) == {1, 3}
    assert len(sample_many(SamplingParams(temperature=5.0))) == 5


def test_top_p_keeps_the_smallest_set_reaching_the_mass():
    probs = torch.softmax(LOGITS, dim=-1)
    p_two = float(probs[1] + probs[3])
    kept = filter_logits(LOGITS, SamplingParams(top_p=p_two - 1e-3)).isfinite().nonzero().flatten().tolist()
    assert kept == [1, 3]


def test_seeded_sampling_is_reproducible():
    params = SamplingParams(temperature=2.0)
    runs = []
    for _ in range(2):
        g = torch.Generator().manual_seed(7)
        runs.append([pick_token(LOGITS, params, generator=g)[0] for _ in range(30)])
    assert runs[0] == runs[1]


def test_penalties_push_away_from_repeated_tokens():
    history = TokenHistory(5, prompt=[])
    for _ in range(3):
        history.add(1)
    params = SamplingParams(temperature=0.0, frequency_penalty=0.1)
    assert pick_token(LOGITS, params, history=history)[0] == 3
    rep = TokenHistory(5, prompt=[1])
    assert pick_token(LOGITS, SamplingParams(temperature=0.0, repetition_penalty=1.2), history=rep)[0] == 3


def test_logprobs_are_the_raw_distribution_with_sorted_alternatives():
    token, lp = pick_token(LOGITS, SamplingParams(temperature=0.0, frequency_penalty=2.0), top_logprobs=3,
                           history=TokenHistory(5, prompt=[]))
    expected = torch.log_softmax(LOGITS, dim=-1)
    assert lp.token_id == token and lp.logprob == pytest.approx(float(expected[token]))
    assert [t for t, _ in lp.top] == [1, 3, 2]
    assert math.isclose(sum(math.exp(p) for p in expected.tolist()), 1.0, rel_tol=1e-5)
    assert pick_token(LOGITS, SamplingParams(), top_logprobs=0)[1].top == ()
