"""Incremental detokenization: every chunking of a sequence yields the text of a full decode."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.postprocessor.core.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer

pytestmark = pytest.mark.unit

MULTIBYTE = "Hi 🤖🎉 你好，世界！ ございます 𝕏 naïve 👨‍👩‍👧 done"
PROMPT = "<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\n"


def stream(tokenizer, ids, chunk_sizes, prompt_ids=(), skip_special=False):
    """Feeds ``ids`` in chunks of the given sizes; returns the pieces emitted (flush last)."""
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, skip_special)
    pieces, pos = [], 0
    for size in chunk_sizes:
        pieces.append(detok.push(ids[pos:pos + size]))
        pos += size
    pieces.append(detok.push(ids[pos:]))
    pieces.append(detok.flush())
    return pieces


def random_chunking(rng, n):
    sizes = []
    while sum(sizes) < n:
        sizes.append(rng.randint(1, 5))
    return sizes


def test_multibyte_characters_split_across_tokens_are_never_emitted_in_pieces(tokenizer):
    ids = tokenizer.encode(MULTIBYTE, add_special_tokens=False).ids
    # The Qwen BPE really does split these characters into byte-level tokens.
    assert any(tokenizer.decode([i]).endswith(REPLACEMENT_CHAR) for i in ids)
    pieces = stream(tokenizer, ids, [1] * len(ids))
    assert "".join(pieces) == MULTIBYTE
    assert not any(REPLACEMENT_CHAR in p for p in pieces)


def test_one_token_at_a_time_emits_whole_characters_only(tokenizer):
    ids = tokenizer.encode(" 🤖", add_special_tokens=False).ids
    assert len(ids) == 3  # " \xf0\x9f", "\xa4", "\x96"
    pieces = stream(tokenizer, ids, [1] * len(ids))
    assert pieces == ["", "", " 🤖", "", ""]


@pytest.mark.parametrize("seed", range(20))
def test_every_chunking_gives_the_full_decode(tokenizer, seed):
    ids = tokenizer.encode(MULTIBYTE * 2, add_special_tokens=False).ids
    rng = random.Random(seed)
    pieces = stream(tokenizer, ids, random_chunking(rng, len(ids)))
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=False)
    assert not any(REPLACEMENT_CHAR in p for p in pieces)


def test_all_two_way_splits(tokenizer):
    ids = tokenizer.encode("a🎉b你c", add_special_tokens=False).ids
    for split in range(len(ids) + 1):
        assert "".join(stream(tokenizer, ids, [split])) == "a🎉b你c"


def test_whole_chunk_in_one_push_when_it_ends_inside_a_character(tokenizer):
    """The complete part of a chunk is emitted at once; only the unfinished character waits."""
    ids = tokenizer.encode("hello world 🤖", add_special_tokens=False).ids
    detok = IncrementalDetokenizer(tokenizer, ())
    assert detok.push(ids[:-1]) == "hello world"  # the space is in the token holding the emoji's first bytes
    assert detok.push(ids[-1:]) == " 🤖"


def test_prompt_context_does_not_leak_into_output(tokenizer):
    prompt_ids = tokenizer.encode(PROMPT, add_special_tokens=False).ids
    ids = tokenizer.encode("Hello there 🙂", add_special_tokens=False).ids
    assert "".join(stream(tokenizer, ids, [2, 1, 3], prompt_ids)) == "Hello there 🙂"


def test_special_tokens_kept_by_default_and_dropped_on_request(tokenizer):
    ids = tokenizer.encode("<think>hmm</think>ok<|im_end|>", add_special_tokens=False).ids
    assert "".join(stream(tokenizer, ids, [1] * len(ids))) == "<think>hmm</think>ok<|im_end|>"
    skipped = "".join(stream(tokenizer, ids, [1] * len(ids), skip_special=True))
    assert skipped == tokenizer.decode(ids, skip_special_tokens=True)
    assert "<|im_end|>" not in skipped


def test_sequence_cut_inside_a_character_flushes_like_a_full_decode(tokenizer):
    ids = tokenizer.encode("ok 🤖", add_special_tokens=False).ids[:-1]
    pieces = stream(tokenizer, ids, [1] * len(ids))
    assert pieces[-1].endswith(REPLACEMENT_CHAR)
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=False)


def test_window_stays_small_over_a_long_stream(tokenizer):
    ids = tokenizer.encode("word " * 500, add_special_tokens=False).ids
    detok = IncrementalDetokenizer(tokenizer, ())
    for i in range(0, len(ids), 3):
        detok.push(ids[i:i + 3])
        assert len(detok._window) <= 8


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_random_streams_match_full_decode(tokenizer, data):
    """Property: incremental == full decode, also for invalid UTF-8 (random byte-level tokens)."""
    pool = tokenizer.encode(MULTIBYTE, add_special_tokens=False).ids + [151645, 151667, 33, 220]
    ids = data.draw(st.lists(st.one_of(st.sampled_from(pool), st.integers(0, 151642)), max_size=40))
    sizes = data.draw(st.lists(st.integers(1, 6), max_size=20))
    assert "".join(stream(tokenizer, ids, sizes)) == tokenizer.decode(ids, skip_special_tokens=False)
