"""What the mocker says: deterministic text tokens, script rule selection, EOS/min/max handling."""

from __future__ import annotations

import json

import pytest

from services.workers.engine import FinishReason
from services.workers.mocker.outputs import (
    OutputPolicy,
    PseudoRandomTokens,
    TokenPlan,
    parse_script,
    synthetic_logprob,
    text_vocab,
)

pytestmark = pytest.mark.unit

EOS = 151645


def tokens_of(plan: TokenPlan, limit: int = 10_000) -> tuple[list[int], FinishReason]:
    out = []
    for i in range(limit):
        token, finish = plan.token_at(i)
        out.append(token)
        if finish:
            return out, finish
    raise AssertionError("the plan never finished")


@pytest.fixture(scope="module")
def policy(tokenizer) -> OutputPolicy:
    return OutputPolicy.build(tokenizer)


def prompt_ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def test_text_vocab_decodes_to_printable_plain_text(tokenizer):
    vocab = text_vocab(tokenizer)
    assert len(vocab) > 20_000
    assert all(1000 <= i < 30000 for i in vocab)
    texts = tokenizer.decode_batch([[i] for i in vocab[::50]])
    assert all(t.isascii() and t.isprintable() and "<" not in t for t in texts)


def test_default_mode_is_exactly_max_tokens_and_reproducible(policy, tokenizer):
    prompt = prompt_ids(tokenizer, "Tell me a story")
    a, finish = tokens_of(policy.plan(prompt, seed=None, max_tokens=40))
    b, _ = tokens_of(policy.plan(prompt, seed=0, max_tokens=40))
    assert finish is FinishReason.LENGTH and len(a) == 40
    assert a == b  # seed unset means seed 0
    other_seed, _ = tokens_of(policy.plan(prompt, seed=7, max_tokens=40))
    other_prompt, _ = tokens_of(policy.plan(prompt + [11], seed=None, max_tokens=40))
    assert other_seed != a and other_prompt != a
    assert set(a) <= set(policy.vocab)
    text = tokenizer.decode(a)
    assert text.isprintable() and text.strip()


def test_default_mode_ignores_eos(policy, tokenizer):
    out, finish = tokens_of(policy.plan([1, 2, 3], seed=1, max_tokens=25, eos_id=EOS))
    assert len(out) == 25 and EOS not in out and finish is FinishReason.LENGTH


def test_pseudo_random_stream_extends_lazily_and_consistently():
    vocab = list(range(1000, 1100))
    stream = PseudoRandomTokens(vocab, seed=42)
    late = stream.at(200)
    again = PseudoRandomTokens(vocab, seed=42)
    assert [again.at(i) for i in range(201)][-1] == late


SCRIPT = [
    {"match": "weather", "text": "It is sunny."},
    {"match": "capital", "text": "Paris."},
    {"match": "weather", "text": "never chosen: same match as rule 0"},
    {"default": "I do not know."},
]


@pytest.fixture(scope="module")
def scripted(tokenizer, tmp_path_factory) -> OutputPolicy:
    path = tmp_path_factory.mktemp("script") / "script.json"
    path.write_text(json.dumps(SCRIPT))
    return OutputPolicy.build(tokenizer, script_path=path)


@pytest.mark.parametrize(("prompt", "answer"), [
    ("What is the weather?", "It is sunny."),
    ("What is the capital of France?", "Paris."),
    ("The capital looks nice. How is the weather there?", "It is sunny."),  # latest match wins
    ("Weather aside, what is the capital?", "Paris."),  # matching is case-sensitive
    ("Hello!", "I do not know."),
])
def test_script_rule_whose_match_occurs_latest_wins(scripted, tokenizer, prompt, answer):
    out, finish = tokens_of(scripted.plan(prompt_ids(tokenizer, prompt), seed=None, max_tokens=100, eos_id=EOS))
    assert finish is FinishReason.EOS
    assert out[-1] == EOS
    assert tokenizer.decode(out[:-1]) == answer


def test_script_ties_go_to_the_first_rule(scripted, tokenizer):
    answer = scripted.select(prompt_ids(tokenizer, "weather"))
    assert tokenizer.decode(list(answer)) == "It is sunny."


def test_script_reads_special_tokens_in_the_prompt(tokenizer):
    policy = OutputPolicy.build(tokenizer, script_path=None, output_text=None)
    assert policy.select([1, 2]) is None
    rules = OutputPolicy.build(tokenizer, output_text="ok")
    assert tokenizer.decode(list(rules.select([151644, 872]))) == "ok"  # <|im_start|>user


def test_no_match_and_no_default_falls_back_to_text_tokens(tokenizer, tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps([{"match": "zebra", "text": "stripes"}]))
    policy = OutputPolicy.build(tokenizer, script_path=path)
    out, finish = tokens_of(policy.plan(prompt_ids(tokenizer, "hello"), seed=None, max_tokens=12, eos_id=EOS))
    assert len(out) == 12 and finish is FinishReason.LENGTH


def test_max_tokens_truncates_a_scripted_answer(tokenizer):
    policy = OutputPolicy.build(tokenizer, output_text="one two three four five six")
    full = list(policy.select([1]))
    out, finish = tokens_of(policy.plan([1], seed=None, max_tokens=3, eos_id=EOS))
    assert out == full[:3] and finish is FinishReason.LENGTH


def test_min_tokens_pads_before_eos(tokenizer):
    policy = OutputPolicy.build(tokenizer, output_text="Hi")
    answer = list(policy.select([1]))
    out, finish = tokens_of(policy.plan([1], seed=None, max_tokens=100, min_tokens=6, eos_id=EOS))
    assert finish is FinishReason.EOS
    assert len(out) == 7 and out[:len(answer)] == answer and out[-1] == EOS and EOS not in out[:-1]


def test_ignore_eos_continues_to_max_tokens(tokenizer):
    policy = OutputPolicy.build(tokenizer, output_text="Hi")
    answer = list(policy.select([1]))
    out, finish = tokens_of(policy.plan([1], seed=None, max_tokens=9, eos_id=None, ignore_eos=True))
    assert len(out) == 9 and out[:len(answer)] == answer and finish is FinishReason.LENGTH


def test_eos_exactly_at_max_tokens_is_eos(tokenizer):
    policy = OutputPolicy.build(tokenizer, output_text="Hi")
    n = len(policy.select([1]))
    out, finish = tokens_of(policy.plan([1], seed=None, max_tokens=n + 1, eos_id=EOS))
    assert finish is FinishReason.EOS and out[-1] == EOS


@pytest.mark.parametrize("raw", [
    {"match": "a", "text": "b"},
    [{"match": "", "text": "b"}],
    [{"match": "a"}],
    [{"default": "a"}, {"default": "b"}],
    [{"match": "a", "text": 3}],
])
def test_bad_scripts_are_rejected(raw):
    with pytest.raises(ValueError):
        parse_script(raw)


def test_script_mode_needs_a_tokenizer():
    with pytest.raises(ValueError):
        OutputPolicy.build(None, output_text="hi")


def test_synthetic_logprobs_rank_the_sampled_token_first():
    vocab = list(range(1000, 1010))
    lp = synthetic_logprob(1003, 5, 4, vocab)
    assert lp.token_id == 1003 and lp.logprob < 0
    assert lp.top[0][0] == 1003 and len(lp.top) == 4
    assert len({t for t, _ in lp.top}) == 4
    assert [p for _, p in lp.top] == sorted((p for _, p in lp.top), reverse=True)
