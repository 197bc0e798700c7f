"""What the parser oracle tests share (tests/engine_env/{vllm,sglang}/test_*_parser_oracle.py): the engines'
parsers as oracles for ours, fed the golden cases (tests/golden/parsers) as token streams.

The engines' parsers decide on marker token ids (``<think>``, ``[TOOL_CALLS]``,
``<|tool_calls_section_begin|>``, …) and some refuse to start when their markers are not single tokens
of the vocabulary, so each case is fed as the ids a real model of that format would generate, with the
text each id adds. The oracle model directory is the demo model's Qwen tokenizer plus every other
format's markers as special tokens (Qwen already has ``<think>`` and ``<tool_call>``), as each family's
own tokenizer has them, so one directory serves every format. It is built once per session in a
temporary directory (about a second).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import shutil
from pathlib import Path

import orjson
import pytest

from services.postprocessor.core.parsers.backends import ParseContext
from tests.unit.parsers.cases import Case, Result, fold

MARKERS = [
    "<|python_tag|>", "<|eom_id|>", "<|python_start|>", "<|python_end|>",  # llama 3 / 4
    "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[THINK]", "[/THINK]",  # mistral
    "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",  # deepseek
    "◁think▷", "◁/think▷",  # kimi
    "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_section_begin|>",
    "<|tool_call_section_end|>", "<|tool_call_begin|>", "<|tool_call_end|>", "<|tool_call_argument_begin|>",  # kimi k2
    "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",  # glm 4.5 / 4.7
    "<minimax:tool_call>", "</minimax:tool_call>",  # minimax m2
]  # DeepSeek V3.2's DSML tags stay text: vLLM's DSML parser decodes ids without special tokens, so would lose them


def build_oracle_model(demo_model_dir: Path, out: Path) -> Path:
    """A copy of the demo model's tokenizer files with every format's markers as single tokens."""
    from transformers import AutoTokenizer

    out.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "generation_config.json", "chat_template.jinja"):
        if (demo_model_dir / name).exists():
            shutil.copy(demo_model_dir / name, out / name)
    tok = AutoTokenizer.from_pretrained(str(demo_model_dir))
    tok.add_special_tokens({"additional_special_tokens": MARKERS}, replace_extra_special_tokens=False)
    tok.save_pretrained(str(out))
    return out


def token_stream(tokenizer, text: str) -> list[tuple[str, list[int]]]:
    """``text`` as (text delta, ids) steps, one id per step as an engine emits them.

    An id that ends inside a multi-byte character adds no text; its id rides with the next step's.
    """
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text, "the oracle tokenizer must round-trip every case"
    steps, shown, pending = [], "", []
    for i in range(len(ids)):
        pending.append(ids[i])
        now = tokenizer.decode(ids[:i + 1])
        if now.endswith("\ufffd"):
            continue
        steps.append((now[len(shown):], pending))
        shown, pending = now, []
    assert shown == text
    return steps


def tools_json(case: Case) -> str:
    """The case's own tools (schema-typed formats), else the tools a request offering the case's calls would
    carry (open parameter schemas)."""
    if case.tools_json:
        return case.tools_json
    names = {name for name, _ in case.expect.get("calls", [])}
    names |= {case.config.named_function} - {""}
    names |= {"get_weather"}  # every request offers at least one tool
    return orjson.dumps([{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
                         for n in sorted(names)]).decode()


@dataclasses.dataclass(frozen=True)
class Comparable:
    """A parse result as the differential tests compare it.

    Whitespace at both ends of content and reasoning is not compared: ours trims it around
    reasoning (docs/parsers.md), the engines keep it; arguments are compared as parsed JSON.
    """

    content: str
    reasoning: str
    calls: tuple[tuple[str, str], ...]

    @staticmethod
    def of(result: Result) -> "Comparable":
        calls = []
        for name, args in result.calls:
            try:
                parsed = json.dumps(json.loads(args), sort_keys=True, ensure_ascii=False)
            except ValueError:
                parsed = f"<not JSON> {args}"
            calls.append((name, parsed))
        return Comparable(result.content.strip(), result.reasoning.strip(), tuple(calls))


def through_engine(processor, tokenizer, model_dir: Path, case: Case) -> Result:
    """One case through an engine's parsers, fed token by token with each step's ids, as the postprocessor does."""
    prompt = "<|im_start|>assistant\n" + ("<think>\n" if case.config.prompt_opens_reasoning else "")
    context = ParseContext(str(model_dir), tools_json(case), tokenizer.encode(prompt, add_special_tokens=False))
    counter = itertools.count()
    parser = processor.output_parser(case.config, context, new_id=lambda: f"call_{next(counter)}")
    if parser is None:
        return Result(content=case.text)
    deltas = [parser.feed(text, ids) for text, ids in token_stream(tokenizer, case.text)]
    deltas.append(parser.finish())
    result = fold(deltas)
    assert parser.tool_calls == len(result.calls)
    return result


def case_params(cases: list[Case], expected_differences: dict[str, str]) -> list:
    """The cases as pytest params; a known difference is a strict xfail carrying its reason."""
    def param(case: Case):
        reason = expected_differences.get(case.id)
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        return pytest.param(case, id=case.id, marks=marks)

    return [param(c) for c in cases]
