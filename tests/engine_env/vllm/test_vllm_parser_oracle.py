"""Differential tests: every golden parser case through our parsers and through vLLM's.

vLLM's side goes through ``--chat-processor vllm`` (backends/vllm.py), fed one generated token at a
time with its ids, as in serving; ours is the non-streaming parse (its streaming parity is proven by
tests/unit/parsers). Tool calls are compared by name and parsed JSON arguments, content and
reasoning up to surrounding whitespace (``streams.Comparable``). Where the two legitimately differ,
the case is listed in ``EXPECTED_DIFFERENCES`` with the reason, and must keep differing (strict
xfail): if vLLM changes, the list is revisited.
"""

from __future__ import annotations

import pytest

from services.postprocessor.core.parsers.backends import load_chat_processor
from tests.engine_env.parser_oracle import Comparable, case_params, through_engine, token_stream
from tests.unit.parsers.cases import Case, fold, load_cases, run

# Formats both sides implement (our name -> vLLM's is in backends/vllm.py). Harmony is left out:
# vLLM's needs the openai-harmony encoding files, which it downloads on first use (no network in tests).
TOOL_FORMATS = {"", "hermes", "llama3_json", "mistral", "pythonic", "deepseek_v3", "deepseek_v3_1", "deepseek_r1",
                "deepseek_v32", "qwen3_coder", "kimi_k2", "glm45", "glm47", "minimax_m2",
                # issue 37's families (gemma4, jamba, phi4 not yet: their markers must first be oracle tokens)
                "deepseek_v4", "kimi_k3", "minimax_m3"}
# vLLM has no ◁think▷ (kimi) parser.
REASONING_FORMATS = {"", "qwen3", "deepseek_r1", "mistral", "kimi_k2", "minimax", "nemotron", "granite"}

# Where vLLM (0.32, streamed one token at a time) legitimately differs from ours, with why. "vLLM
# streaming" marks a case where vLLM's own non-streaming parse differs from its streaming one too.
_DROPS_MALFORMED = "malformed call: vLLM's streaming drops the text; ours shows it as content (docs/parsers.md)"
_TEXT_AFTER_CALL = "text after a call: vLLM drops it (streaming) or keeps the whole output as content; ours streams it"
_MISTRAL_LIST = ("vLLM's mistral parser with a Hugging Face tokenizer assumes the v11 form name[ARGS]{...}; "
                 "the pre-v11 JSON list needs its mistral_common tokenizer")
_PARTIAL_NAME = "a truncated call header: vLLM emits a call with the partial name; ours shows it"
_UNCLOSED = ("a call cut off (or a value without its end tag): vLLM streams the arguments as far as they came, "
             "not valid JSON; ours closes them (docs/parsers.md)")
_RAW_TYPES = ("schema-typed raw values: vLLM makes 'null' null for a string parameter and keeps 'None' and Python "
              "literals as strings; ours keeps a string's text exactly and reads None and literals (docs/parsers.md)")
_QWEN3_NO_THINK = ("vLLM's qwen3 parser treats output as reasoning unless </think> or enable_thinking=false says "
                   "otherwise (Qwen3 templates open <think>); ours only when the output or the prompt opened it")
_THINKING_OFF = ("thinking off, a <think> block the model writes anyway: the engine leaves it in the content; ours "
                 "separates it, as Dynamo 1.6.1 does (tests/golden/parsers/dynamo, docs/parsers.md)")
EXPECTED_DIFFERENCES: dict[str, str] = {
    "qwen3-thinking-disabled": _THINKING_OFF,
    "kimi-k2-plain-answer-is-content": ("an answer without thinking markers: vLLM's kimi_k2 reasoning parser makes it "
                                        "reasoning; ours keeps it content, as Dynamo 1.6.1 does"),
    "deepseek-truncated-header": _DROPS_MALFORMED,
    "required-not-a-list": "tool_choice=required output that is not a call list: vLLM drops it, ours shows it",
    "hermes-nested-json": "</tool_call> inside a JSON string ends vLLM's call early (regex on text)",
    "hermes-arguments-before-name": "vLLM streaming: keys after the arguments leak into the argument fragments",
    "hermes-parameters-key": "vLLM accepts only 'arguments', not 'parameters' (ours accepts both)",
    "hermes-string-arguments": "arguments given as a JSON string: vLLM forwards the string, ours the object it encodes",
    "hermes-no-arguments": "a call without arguments: vLLM streams no arguments, ours '{}'",
    "hermes-malformed-no-name": _DROPS_MALFORMED,
    "hermes-malformed-not-json": _DROPS_MALFORMED,
    "hermes-malformed-after-name": "broken JSON after the name: vLLM streams the rest as arguments, ours ends the call",
    "hermes-truncated-before-name": _DROPS_MALFORMED,
    "hermes-missing-close-tag": _TEXT_AFTER_CALL,
    "hermes-text-after": _TEXT_AFTER_CALL,
    "hermes-lookalike-markers": "vLLM streaming holds back a trailing partial '<tool_call' forever; ours flushes it",
    "llama3-leading-whitespace": ("vLLM streaming: a call after leading whitespace is content (its non-streaming parse "
                                  "finds it)"),
    "llama3-json-answer-is-content": "a JSON answer with a 'name' key: vLLM streams a call, ours needs 'name' first",
    "llama3-text-then-tag": ("vLLM streaming: <|python_tag|> after text is content (its non-streaming parse finds the "
                             "call)"),
    "llama3-call-then-text": _TEXT_AFTER_CALL,
    "llama3-malformed-after-tag": _DROPS_MALFORMED,
    "mistral-list-single": _MISTRAL_LIST,
    "mistral-list-two": _MISTRAL_LIST,
    "mistral-text-before": _MISTRAL_LIST,
    "mistral-call-id": "vLLM's v11 path does not know [CALL_ID]: the id becomes part of the name",
    "mistral-malformed-list": _MISTRAL_LIST,
    "mistral-truncated-name": "a truncated name: vLLM emits the call, ours shows the text (the name was never closed)",
    "pythonic-python-start": ("vLLM's pythonic parser does not strip <|python_start|>...<|python_end|> "
                              "(llama4_pythonic)"),
    "pythonic-not-a-literal": "a non-literal argument: vLLM drops the output, ours keeps it as a string",
    "pythonic-list-not-call": "vLLM streaming drops a list that turns out not to be calls; ours shows it",
    "pythonic-text-after": _TEXT_AFTER_CALL,
    "qwen3-no-think": _QWEN3_NO_THINK,
    "qwen3-leading-space-no-think": _QWEN3_NO_THINK,
    "qwen3-think-later-is-content": _QWEN3_NO_THINK,
    # The families added in issue 20.
    "deepseek-v32-truncated-invoke-is-text": _PARTIAL_NAME,
    "deepseek-v32-truncated-string-value-is-closed": _UNCLOSED,
    "glm45-truncated-value-is-closed": _UNCLOSED,
    "glm45-truncated-name-is-text": _DROPS_MALFORMED,
    "glm45-missing-value-end": _UNCLOSED,
    "kimi-k2-text-before-and-after": _TEXT_AFTER_CALL,
    "kimi-k2-singular-section-and-bare-name": ("vLLM does not parse a call in K2's singular "
                                               "<|tool_call_section_begin|> section or without the functions. prefix"),
    "kimi-k2-truncated-header-is-text": _PARTIAL_NAME,
    "kimi-k2-empty-section-is-text": "an empty tool-call section: vLLM drops it and the text after it; ours shows both",
    "minimax-m2-two-calls-one-section": "whitespace around a MiniMax value: vLLM keeps it, ours drops it as layout",
    "minimax-m2-truncated-invoke-is-text": _DROPS_MALFORMED,
    "minimax-m2-truncated-value-is-closed": _UNCLOSED,
    "minimax-m2-invoke-without-name-is-text": _DROPS_MALFORMED,
    "minimax-m2-missing-section-end-text-after-is-content": _TEXT_AFTER_CALL,
    "qwen3-coder-every-type": _RAW_TYPES,
    "qwen3-coder-missing-parameter-end": _UNCLOSED,
    "qwen3-coder-truncated-in-value-is-closed": _UNCLOSED,
    "qwen3-coder-truncated-header-is-text": _PARTIAL_NAME,
    "qwen3-coder-empty-name-is-text": _DROPS_MALFORMED,
    "qwen3-coder-json-inside-tool-call-is-text": _DROPS_MALFORMED,
    # The families added in issue 37.
    "deepseek-v4-cut-off": _UNCLOSED,
    "kimi-k3-cut-off-call": "a call cut off in a value: vLLM drops the call; ours closes what streamed",
    "minimax-m3-cut-off": "a call cut off in a value: vLLM sends it with {} arguments; ours closes what streamed",
    "minimax-m3-broken-before-name": _PARTIAL_NAME,
    "granite-heres-variant": "the \"Here's my thought process:\" header: vLLM leaves its colon in the reasoning",
    "granite-truncated-thought": ("vLLM holds back a trailing partial 'Here is my resp' header and never flushes it; "
                                  "ours flushes it as reasoning"),
}

CASES = [c for c in load_cases()
         if c.config.tool_call_parser in TOOL_FORMATS and c.config.reasoning_parser in REASONING_FORMATS]


@pytest.fixture(scope="module")
def vllm_processor():
    return load_chat_processor("vllm")


@pytest.fixture(scope="module")
def tokenizer(oracle_model_dir):
    from services.postprocessor.core.parsers.backends.vllm import _tokenizer

    return _tokenizer(str(oracle_model_dir))


@pytest.mark.parametrize("case", case_params(CASES, EXPECTED_DIFFERENCES))
def test_vllm_agrees_with_ours(case: Case, vllm_processor, tokenizer, oracle_model_dir):
    ours = Comparable.of(run(case.config, [case.text], case.tools_json))
    theirs = Comparable.of(through_engine(vllm_processor, tokenizer, oracle_model_dir, case))
    assert theirs == ours, f"vLLM {theirs} != ours {ours}"


def test_expected_differences_name_real_cases():
    ids = {c.id for c in CASES}
    assert set(EXPECTED_DIFFERENCES) <= ids, set(EXPECTED_DIFFERENCES) - ids


def test_the_service_builds_vllm_parsers_from_the_request(vllm_processor, tokenizer, oracle_model_dir):
    """The postprocessor's own path: request options and prompt ids (a proto field) to a vLLM parser."""
    from meshfront.common.v1 import common_pb2

    from services.postprocessor.service import output_parser

    prompt = tokenizer.encode("<|im_start|>assistant\n<think>\n", add_special_tokens=False)
    options = common_pb2.PostprocessOptions(
        model_dir=str(oracle_model_dir), tool_call_parser="hermes", reasoning_parser="qwen3",
        tools_json='[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]',
        prompt_opens_reasoning=True)
    parser = output_parser(options, vllm_processor, common_pb2.PreprocessedRequest(token_ids=prompt))
    assert parser is not None
    text = 'hm</think>ok<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
    deltas = [parser.feed(t, ids) for t, ids in token_stream(tokenizer, text)] + [parser.finish()]
    result = fold(deltas)
    assert (result.reasoning.strip(), result.content, result.calls) == ("hm", "ok", [["f", '{"a": 1}']])
    assert parser.ends_with_tool_calls
