"""Stop strings with hold-back: a stop string never leaks, whatever the chunking."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.postprocessor.core.stop import StopStringMatcher

pytestmark = pytest.mark.unit


def run(stops, chunks, include=False, checks=None):
    """Feeds chunks; returns (emitted pieces, matched stop, text flushed at the end)."""
    matcher = StopStringMatcher(stops, include)
    pieces = []
    for i, chunk in enumerate(chunks):
        result = matcher.feed(chunk, check=True if checks is None else checks[i])
        pieces.append(result.text)
        if result.matched is not None:
            return pieces, result.matched, ""
    return pieces, None, matcher.flush()


def chunkings(text, rng, count=30):
    yield list(text)
    yield [text]
    for _ in range(count):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, min(6, len(text) - 1))))
        yield [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


@pytest.mark.parametrize("include", [False, True])
def test_stop_split_across_chunks_never_leaks(include):
    text = "Hello ###END and more"
    expected = "Hello ###END" if include else "Hello "
    for chunks in chunkings(text, random.Random(1)):
        pieces, matched, _ = run(["###END"], chunks, include)
        assert matched == "###END"
        emitted = ""
        for piece in pieces:
            emitted += piece
            assert expected.startswith(emitted), (chunks, pieces)  # no prefix of the stop ever leaked
        assert emitted == expected


def test_partial_match_is_held_then_released():
    matcher = StopStringMatcher(["###"])
    assert matcher.feed("a##").text == "a"
    assert matcher.feed("b").text == "##b"


def test_held_back_text_is_flushed_at_the_end():
    pieces, matched, tail = run(["###"], ["Hello #", "#"])
    assert (pieces, matched, tail) == (["Hello ", ""], None, "##")


def test_several_stop_strings_first_to_complete_wins_for_every_chunking():
    text = "xxabcdyy"
    for chunks in chunkings(text, random.Random(2)):
        pieces, matched, _ = run(["abcd", "bc"], chunks)
        assert (matched, "".join(pieces)) == ("bc", "xxa")


def test_same_end_prefers_the_longer_match():
    pieces, matched, _ = run(["bc", "abc"], ["xabc"])
    assert (matched, "".join(pieces)) == ("abc", "x")


def test_stop_at_the_very_start_and_include():
    assert run(["<|x|>"], ["<|x|>tail"]) == ([""], "<|x|>", "")
    assert run(["<|x|>"], ["<|x", "|>tail"], include=True) == (["", "<|x|>"], "<|x|>", "")


def test_unchecked_text_never_matches_but_a_stop_completing_later_does():
    # "STOP" entirely before min_tokens does not count; a later one does.
    pieces, matched, _ = run(["STOP"], ["aSTOPb", "cSTOP"], checks=[False, True])
    assert (matched, "".join(pieces)) == ("STOP", "aSTOPbc")
    # A stop string that starts before the threshold and completes after it counts.
    pieces, matched, _ = run(["STOP"], ["aST", "OPz"], checks=[False, True])
    assert (matched, "".join(pieces)) == ("STOP", "a")


def test_no_stop_strings_passes_text_through():
    matcher = StopStringMatcher(["", ""])
    assert not matcher.active
    assert matcher.feed("abc").text == "abc"


def test_held_tail_never_exceeds_longest_stop():
    matcher = StopStringMatcher(["aaaa"])
    for _ in range(100):
        matcher.feed("a" * 3 + "b")
        assert len(matcher._held) <= 3


def reference(text, stops, include):
    """The whole-text answer: the stop that completes first (then starts first), or none."""
    matches = [(text.find(s) + len(s), text.find(s), s) for s in stops if s and s in text]
    if not matches:
        return text, None
    end, start, stop = min(matches)
    return text[:end] if include else text[:start], stop


@settings(max_examples=300, deadline=None)
@given(text=st.text("ab#\n", max_size=30), stops=st.lists(st.text("ab#\n", min_size=1, max_size=4), max_size=3),
       cuts=st.lists(st.integers(0, 30), max_size=8), include=st.booleans())
def test_any_chunking_matches_the_whole_text_answer(text, stops, cuts, include):
    bounds = sorted({c for c in cuts if c < len(text)} | {0, len(text)})
    chunks = [text[a:b] for a, b in itertools.pairwise(bounds)]
    pieces, matched, tail = run(stops, chunks, include)
    expected_text, expected_stop = reference(text, stops, include)
    assert matched == expected_stop
    emitted = ""
    for piece in pieces:
        emitted += piece
        assert expected_text.startswith(emitted)  # nothing past the answer ever leaked
    assert emitted + tail == expected_text
