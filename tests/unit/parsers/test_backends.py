"""Chat-processor backends as the main environment sees them: ours works, the engines stay unimported.

The engines' adapters themselves are tested against our parsers in the engines' environments
(tests/engine_env/*/test_*_parser_oracle.py, part of ``make test``); here vLLM and SGLang are absent (the main
lock file has neither).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from services.postprocessor.config import parse_config
from services.postprocessor.core.parsers import ParserConfig
from services.postprocessor.core.parsers.backends import (
    CHAT_PROCESSORS,
    ChatProcessorUnavailable,
    OursChatProcessor,
    ParseContext,
    load_chat_processor,
)
from tests.unit.parsers.cases import fold

pytestmark = pytest.mark.unit

ENGINES = ("vllm", "sglang")


def test_the_registry_names_ours_and_both_engines():
    assert CHAT_PROCESSORS == ("ours", "vllm", "sglang")


def test_ours_parses_through_the_processor_interface():
    processor = load_chat_processor("ours")
    assert isinstance(processor, OursChatProcessor)
    config = ParserConfig(tool_call_parser="hermes", reasoning_parser="qwen3", has_tools=True)
    parser = processor.output_parser(config, ParseContext())
    text = '<think>hm</think>ok<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
    result = fold([parser.feed(text[:9], [1, 2]), parser.feed(text[9:]), parser.finish()])
    assert (result.reasoning, result.content, result.calls) == ("hm", "ok", [["f", '{"a": 1}']])
    assert parser.ends_with_tool_calls


def test_ours_gives_no_parser_for_plain_requests():
    assert load_chat_processor("ours").output_parser(ParserConfig(), ParseContext()) is None


@pytest.mark.parametrize("engine", ENGINES)
def test_selecting_a_missing_engine_is_a_clear_startup_error(engine):
    if importlib.util.find_spec(engine) is not None:
        pytest.fail(f"{engine} is installed in the main environment; this test expects it absent")
    message = rf"--chat-processor {engine} needs {engine}.*meshfront\[{engine}\]"
    with pytest.raises(ChatProcessorUnavailable, match=message):
        load_chat_processor(engine)
    assert engine not in sys.modules


def test_an_unknown_processor_is_rejected():
    with pytest.raises(ValueError, match="unknown chat processor 'tgi'"):
        load_chat_processor("tgi")
    with pytest.raises(ValueError, match="--chat-processor 'tgi' is not one of ours, vllm, sglang"):
        parse_config(["--chat-processor", "tgi"], env={})


def test_the_flag_and_its_env_twin():
    assert parse_config([], env={}).chat_processor == "ours"
    assert parse_config([], env={"MESHFRONT_POSTPROCESSOR_CHAT_PROCESSOR": "vllm"}).chat_processor == "vllm"


def test_the_postprocessor_exits_with_the_reason_when_the_engine_is_missing():
    proc = subprocess.run([sys.executable, "-m", "services.postprocessor", "--chat-processor", "vllm", "--port", "0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "--chat-processor vllm needs vllm" in proc.stderr


def test_importing_the_postprocessor_imports_no_engine():
    """In a fresh interpreter: every postprocessor module, and still no vllm / sglang module loaded."""
    code = ("import sys, services.postprocessor.main, services.postprocessor.service, "
            "services.postprocessor.core.parsers.backends as b; b.load_chat_processor('ours'); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'sglang')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_single_tool_call_keeps_the_first_call_only():
    from services.postprocessor.core.parsers import ParserConfig, build_output_parser
    from services.postprocessor.core.parsers.output import SingleToolCall

    text = ('<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
            '<tool_call>\n{"name": "b", "arguments": {"y": 2}}\n</tool_call>')
    config = ParserConfig("hermes", has_tools=True)
    for chunk_size in (1, 7, len(text)):
        parser = SingleToolCall(build_output_parser(config))
        deltas = [parser.feed(text[i:i + chunk_size]) for i in range(0, len(text), chunk_size)] + [parser.finish()]
        calls = [c for d in deltas for c in d.tool_calls]
        assert {c.index for c in calls} == {0}
        assert [c.name for c in calls if c.name] == ["a"]
        assert "".join(c.arguments for c in calls) == '{"x": 1}'
        assert parser.tool_calls == 1 and parser.ends_with_tool_calls
