"""Differential tests: every golden parser case through our parsers and through SGLang's.

SGLang's side goes through ``--chat-processor sglang`` (backends/sglang.py), fed one generated
token's text at a time, as in serving; ours is the non-streaming parse. Compared as in the vLLM
oracle (``streams.Comparable``); legitimate differences are listed in ``EXPECTED_DIFFERENCES`` with
the reason and must keep differing (strict xfail). tool_choice required / named cases are left out:
the SGLang backend parses them with ours (backends/sglang.py).
"""

from __future__ import annotations

import itertools

import pytest

from services.postprocessor.core.parsers.backends import ParseContext, load_chat_processor
from tests.engine_env.parser_oracle import Comparable, case_params, through_engine, tools_json
from tests.unit.parsers.cases import Case, fold, load_cases, run

# Formats both sides implement (our name -> SGLang's is in backends/sglang.py); harmony left out (as for
# vLLM: its encoding files are downloaded on first use).
TOOL_FORMATS = {"", "hermes", "llama3_json", "mistral", "pythonic", "deepseek_v3", "deepseek_v3_1", "deepseek_r1",
                "deepseek_v32", "qwen3_coder", "kimi_k2", "glm45", "glm47", "minimax_m2",
                "deepseek_v4", "kimi_k3", "minimax_m3"}  # issue 37's families
# SGLang has no parser for Granite 3's "Here is my thought process:" headers (its granite_thinking_parser
# reads Granite 4.2's <think> tags).
REASONING_FORMATS = {"", "qwen3", "deepseek_r1", "mistral", "kimi", "kimi_k2", "minimax", "nemotron"}

# Where SGLang (0.5.23, streamed one token's text at a time) legitimately differs from ours, with why.
_DROPS_MALFORMED = "malformed or truncated call: SGLang's streaming drops the text; ours shows it as content"
_HOLDS_TAIL = "SGLang holds back text that may start a marker and never flushes it at the end of the stream"
_MISTRAL = "SGLang's mistral detector streams only one call of a [TOOL_CALLS] list and misses other forms"
_PYTHONIC = "SGLang's pythonic streaming loses calls whose arguments hold lists, dicts or delimiters in strings"
_UNCLOSED = ("a call cut off (or a value without its end tag): SGLang streams the arguments as far as they came, "
             "not valid JSON, or drops the call; ours closes them (docs/parsers.md)")
_RAW_TYPES = ("schema-typed raw values: SGLang makes 'null' null for a string parameter, keeps 'None' as a string and "
              "reads 'yes' as false for a boolean; ours keeps a string's text exactly (docs/parsers.md)")
_NOT_FIRST = ("a prompt that did not open the block: SGLang's parser needs an opening <think> (its server forces "
              "reasoning from the rendered prompt); ours starts in reasoning, as this format's template opens it")
_THINKING_OFF = ("thinking off, a <think> block the model writes anyway: the engine leaves it in the content; ours "
                 "separates it, as Dynamo 1.6.1 does (tests/golden/parsers/dynamo, docs/parsers.md)")
EXPECTED_DIFFERENCES: dict[str, str] = {
    "qwen3-thinking-disabled": _THINKING_OFF,
    "deepseek-truncated-header": _DROPS_MALFORMED,
    "hermes-string-arguments": ("arguments given as a JSON string: SGLang forwards the string, ours the object it "
                                "encodes"),
    "hermes-malformed-no-name": _DROPS_MALFORMED,
    "hermes-malformed-not-json": _DROPS_MALFORMED,
    "hermes-malformed-after-name": _DROPS_MALFORMED,
    "hermes-truncated": "a truncated call: SGLang withholds the last partial argument fragment; ours sends it",
    "hermes-truncated-before-name": _DROPS_MALFORMED,
    "hermes-lookalike-markers": _HOLDS_TAIL,
    "llama3-leading-whitespace": "SGLang streaming: a call after leading whitespace is content",
    "llama3-json-answer-is-content": "a JSON answer with a 'name' key: SGLang swallows it, ours shows it",
    "llama3-malformed-after-tag": _DROPS_MALFORMED,
    "mistral-list-single": _MISTRAL,
    "mistral-list-two": _MISTRAL,
    "mistral-call-id": "SGLang does not know the [CALL_ID] form: the call stays content",
    "mistral-text-before": _MISTRAL,
    "mistral-malformed-list": _DROPS_MALFORMED,
    "mistral-no-calls": "SGLang streaming drops ']' characters from plain text that mentions [TOOL]",
    "mistral-truncated-name": _DROPS_MALFORMED,
    "pythonic-two-calls-types": _PYTHONIC,
    "pythonic-string-with-delimiters": _PYTHONIC,
    "pythonic-not-a-literal": "a non-literal argument: SGLang drops the output, ours keeps it as a string",
    "pythonic-plain-text": _HOLDS_TAIL,
    # The families added in issue 20.
    "deepseek-v32-text-before": "SGLang strips whitespace around a string=\"true\" DSML value; ours keeps it exactly",
    "deepseek-v32-no-string-attribute-uses-schema": ("SGLang drops a DSML call whose parameters have no "
                                                     "string attribute"),
    "deepseek-v32-truncated-invoke-is-text": _DROPS_MALFORMED,
    "deepseek-v32-truncated-string-value-is-closed": _UNCLOSED,
    "glm45-truncated-value-is-closed": _UNCLOSED,
    "glm45-truncated-name-is-text": _DROPS_MALFORMED,
    "kimi-k2-singular-section-and-bare-name": ("SGLang parses the call in K2's singular <|tool_call_section_begin|> "
                                               "section but shows the section markers as content"),
    "kimi-k2-truncated-header-is-text": _DROPS_MALFORMED,
    "kimi-k2-empty-section-is-text": "an empty tool-call section: SGLang drops its markers; ours shows them",
    # Both cases now say their prompt opened the block (prompt_opens_reasoning), as a K2 template does: agreed.
    "nemotron-reasoning-first": _NOT_FIRST,
    "minimax-m2-two-calls-one-section": "SGLang's minimax-m2 streaming emits only the first call of a section",
    "minimax-m2-every-type": _RAW_TYPES,
    "minimax-m2-truncated-invoke-is-text": _DROPS_MALFORMED,
    "minimax-m2-truncated-value-is-closed": _UNCLOSED,
    "minimax-m2-invoke-without-name-is-text": _DROPS_MALFORMED,
    "minimax-m2-missing-section-end-text-after-is-content": "text after a section without its end: SGLang drops it",
    "qwen3-coder-every-type": _RAW_TYPES,
    "qwen3-coder-unconvertible-values-stay-strings": _RAW_TYPES,
    "qwen3-coder-truncated-header-is-text": _DROPS_MALFORMED,
    "qwen3-coder-empty-name-is-text": _DROPS_MALFORMED,
    "qwen3-coder-json-inside-tool-call-is-text": _DROPS_MALFORMED,
    "qwen3-think-later-is-content": ("SGLang's qwen3 takes a <think> block anywhere as reasoning; ours only at the "
                                     "start"),
    # The families added in issue 37.
    "deepseek-v4-v32-block-is-text": "V3.2's function_calls block under V4's parser: SGLang drops it; ours shows it",
    "deepseek-v4-cut-off": "a call cut off in a value: SGLang drops the call; ours closes what streamed",
    "kimi-k3-cut-off-call": "a call cut off in a value: SGLang drops the call; ours closes what streamed",
    "minimax-m3-cut-off": _UNCLOSED,
    "minimax-m3-broken-before-name": _DROPS_MALFORMED,
}

CASES = [c for c in load_cases()
         if c.config.tool_call_parser in TOOL_FORMATS and c.config.tool_choice == "auto"
         and c.config.reasoning_parser in REASONING_FORMATS]


@pytest.fixture(scope="module")
def sglang_processor():
    return load_chat_processor("sglang")


@pytest.fixture(scope="module")
def tokenizer(oracle_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(oracle_model_dir))


@pytest.mark.parametrize("case", case_params(CASES, EXPECTED_DIFFERENCES))
def test_sglang_agrees_with_ours(case: Case, sglang_processor, tokenizer, oracle_model_dir):
    ours = Comparable.of(run(case.config, [case.text], case.tools_json))
    theirs = Comparable.of(through_engine(sglang_processor, tokenizer, oracle_model_dir, case))
    assert theirs == ours, f"SGLang {theirs} != ours {ours}"


def test_a_call_whose_end_comes_in_the_same_chunk_as_its_arguments_keeps_them(sglang_processor, oracle_model_dir):
    """A worker's message can carry a whole call (the mocker at speed, a speculative engine): SGLang's streaming
    detector then announces the call without streaming its arguments, and the backend's ``finish`` supplies
    them from SGLang's non-streaming parse. (Other whole-chunk texts lose more in SGLang's streaming: a second
    call, or the call itself; those stay as SGLang streams them.)"""
    case = next(c for c in CASES if c.id == "hermes-single")
    context = ParseContext(str(oracle_model_dir), tools_json(case), [])
    counter = itertools.count()
    parser = sglang_processor.output_parser(case.config, context, new_id=lambda: f"call_{next(counter)}")
    theirs = Comparable.of(fold([parser.feed(case.text), parser.finish()]))
    assert theirs == Comparable.of(run(case.config, [case.text], case.tools_json))


def test_expected_differences_name_real_cases():
    ids = {c.id for c in CASES}
    assert set(EXPECTED_DIFFERENCES) <= ids, set(EXPECTED_DIFFERENCES) - ids

