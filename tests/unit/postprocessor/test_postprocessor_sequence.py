"""One sequence end to end on the real tokenizer: hidden EOS, min_tokens, stop strings, counting."""

from __future__ import annotations

import random

import pytest

from services.models.qwen import EOS_TOKEN_IDS
from services.postprocessor.core.sequence import FinishReason, SequenceDecoder, SequenceOptions

pytestmark = pytest.mark.unit

IM_END = EOS_TOKEN_IDS[0]
HIDDEN = frozenset(EOS_TOKEN_IDS)


def encode(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False).ids


def run(tokenizer, chunks, options, worker_finish=FinishReason.LENGTH):
    """Steps every chunk (the worker's finish reason on the last); returns the deltas and the decoder."""
    decoder = SequenceDecoder(tokenizer, options)
    deltas = []
    for i, chunk in enumerate(chunks):
        deltas.append(decoder.step(chunk, worker_finish if i == len(chunks) - 1 else None))
        if decoder.finish is not None:
            break
    return deltas, decoder


def split(ids, rng):
    chunks, pos = [], 0
    while pos < len(ids):
        size = rng.randint(1, 6)
        chunks.append(ids[pos:pos + size])
        pos += size
    return chunks


def test_hidden_eos_ends_the_sequence_and_its_text_is_never_shown(tokenizer):
    ids = encode(tokenizer, "Hello 世界") + [IM_END] + encode(tokenizer, " junk")
    deltas, decoder = run(tokenizer, [ids], SequenceOptions(hidden_stop_ids=HIDDEN))
    assert [(d.text, d.finish, d.stop_reason) for d in deltas] == [("Hello 世界", FinishReason.EOS, None)]
    # Counted like vLLM/OpenAI: the EOS id is a generated token; ids after it are not.
    assert deltas[0].tokens == len(encode(tokenizer, "Hello 世界")) + 1
    assert decoder.generated_ids == ids[:deltas[0].tokens]


def test_worker_eos_without_hidden_ids_shows_the_text(tokenizer):
    ids = encode(tokenizer, "a") + [IM_END]
    deltas, _ = run(tokenizer, [ids], SequenceOptions(), worker_finish=FinishReason.EOS)
    assert (deltas[0].text, deltas[0].finish) == ("a<|im_end|>", FinishReason.EOS)


def test_min_tokens_suppresses_early_eos_and_hides_it(tokenizer):
    ids = encode(tokenizer, "one") + [IM_END] + encode(tokenizer, " two three") + [IM_END]
    options = SequenceOptions(hidden_stop_ids=HIDDEN, min_tokens=3)
    for seed in range(10):
        deltas, decoder = run(tokenizer, split(ids, random.Random(seed)), options, worker_finish=None)
        assert "".join(d.text for d in deltas) == "one two three"
        assert deltas[-1].finish == FinishReason.EOS
        assert sum(d.tokens for d in deltas) == len(ids)


def test_eos_exactly_at_min_tokens_ends_the_sequence(tokenizer):
    ids = encode(tokenizer, "a b") + [IM_END]
    at_min = SequenceOptions(hidden_stop_ids=HIDDEN, min_tokens=len(ids))
    deltas, _ = run(tokenizer, [ids], at_min, worker_finish=None)
    assert (deltas[0].text, deltas[0].finish) == ("a b", FinishReason.EOS)
    before_min = SequenceOptions(hidden_stop_ids=HIDDEN, min_tokens=len(ids) + 1)
    deltas, _ = run(tokenizer, [ids], before_min, worker_finish=None)
    assert (deltas[0].text, deltas[0].finish) == ("a b", None)


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_over_tokens_for_every_chunking(tokenizer, include):
    text = "The answer is 42 🤖.\n\nUser: more"
    ids = encode(tokenizer, text)
    options = SequenceOptions(stop_strings=("User:", "Observation"), include_stop_str=include)
    expected = "The answer is 42 🤖.\n\n" + ("User:" if include else "")
    for seed in range(15):
        deltas, _ = run(tokenizer, split(ids, random.Random(seed)), options)
        emitted = ""
        for d in deltas:
            emitted += d.text
            assert expected.startswith(emitted)
        assert emitted == expected
        assert (deltas[-1].finish, deltas[-1].stop_reason) == (FinishReason.STOP, "User:")


def test_stop_string_before_min_tokens_is_ignored(tokenizer):
    ids = encode(tokenizer, "END then END")
    options = SequenceOptions(stop_strings=("END",), min_tokens=2)
    deltas, _ = run(tokenizer, [[i] for i in ids], options)
    assert "".join(d.text for d in deltas) == "END then "
    assert deltas[-1].stop_reason == "END"


def test_held_back_text_is_flushed_when_the_worker_finishes(tokenizer):
    ids = encode(tokenizer, "value: ##")
    deltas, _ = run(tokenizer, [ids[:-1], ids[-1:]], SequenceOptions(stop_strings=("###",)))
    assert [d.text for d in deltas] == ["value:", " ##"]
    assert (deltas[-1].finish, deltas[-1].stop_reason) == (FinishReason.LENGTH, None)


def test_worker_finish_reasons_pass_through(tokenizer):
    for finish in FinishReason:
        deltas, _ = run(tokenizer, [encode(tokenizer, "x")], SequenceOptions(), worker_finish=finish)
        assert (deltas[-1].text, deltas[-1].finish) == ("x", finish)


def test_steps_after_finish_are_ignored(tokenizer):
    decoder = SequenceDecoder(tokenizer, SequenceOptions(hidden_stop_ids=HIDDEN))
    decoder.step([IM_END])
    assert decoder.step(encode(tokenizer, "late")).text == ""
    assert decoder.generated_ids == [IM_END]
