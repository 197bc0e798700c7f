"""Meshfront's parsers against Dynamo 1.6.1's own split of the same model outputs (issue 37).

``tests/golden/parsers/dynamo/*.json`` were recorded by ``tools/dynamo_replay.py`` through Dynamo's
frontend; no Dynamo runs here. Each case is parsed as the mesh parses it: the request's thinking
controls go through the preprocessor's rules (``services/preprocessor/core/thinking.py``), the recorded
prompt's tail decides whether the prompt opened a reasoning block, and the text is fed in the chunks
Dynamo's worker streamed, then whole. Content and reasoning must equal Dynamo's up to surrounding
whitespace (Meshfront trims it, docs/parsers.md), tool calls by name and parsed JSON arguments.

``DIFFERENCES`` lists the cases where Dynamo's answer is wrong for an OpenAI client and Meshfront keeps
its own (each has a row in docs/parsers.md); they run as strict xfails, so a parser that starts agreeing
fails the run and the row is revisited.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.postprocessor.core.parsers import ParserConfig, ToolChoice
from services.postprocessor.core.parsers.reasoning import REASONING_NAMES
from services.postprocessor.core.parsers.tool_calls import TOOL_CALL_PARSERS
from services.preprocessor.core.templates import prompt_opens_reasoning
from services.preprocessor.core.thinking import apply_default_thinking_mode, forces_reasoning, thinking_off
from tests.unit.parsers.cases import Result, run

pytestmark = pytest.mark.unit

GOLDEN_DIR = Path(__file__).resolve().parents[2] / "golden" / "parsers" / "dynamo"

# Why Meshfront's answer differs from Dynamo's, by kind (docs/parsers.md, "Where we differ from Dynamo").
CUT_OFF = "a malformed or cut-off call: Dynamo drops the text or the call; we keep the text or close what streamed"
TEXT_AROUND = "text around or after a call: Dynamo drops or keeps markers and separators we do not"
TYPES = "raw values typed by the tools' schema: Dynamo makes 'null' None and other types where the schema says string"
STRAY_MARKER = "a closing marker with no opening one: Dynamo deletes it from the content; we keep the model's text"
HARMONY = ("Dynamo's gpt_oss/harmony parsers read o200k Harmony token ids, which the demo tokenizer's text "
           "replay cannot give them (they return nothing); our text parser is checked in tests/golden/parsers")
MISTRAL_ARGS = "Mistral's [TOOL_CALLS]name[ARGS]{...} form (Magistral, Devstral): Dynamo 1.6.1 leaves it unparsed"
LOST_TEXT = "plain text Dynamo's parser loses: a whole answer, a visible block, or the prose after a marker-like word"
SELF_CLOSING = "a self-closing DSML invoke: Dynamo's V2 parser drops it or gives it the next invoke's arguments"
M3_REASONING_FIRST = ("MiniMax M3's adaptive default: Dynamo reads the output as reasoning first (a plain answer "
                      "vanishes); we split only where the output or the prompt opens <mm:think>")
DIFFERENCES: dict[str, str] = {
    **dict.fromkeys(("dynamo-deepseek-truncated-header", "dynamo-deepseek-v32-truncated-invoke-is-text",
                     "dynamo-deepseek-v32-truncated-string-value-is-closed", "dynamo-glm45-truncated-value-is-closed",
                     "dynamo-glm45-truncated-name-is-text", "dynamo-glm45-missing-value-end",
                     "dynamo-hermes-nested-json", "dynamo-hermes-malformed-no-name", "dynamo-hermes-malformed-not-json",
                     "dynamo-hermes-malformed-after-name", "dynamo-hermes-truncated",
                     "dynamo-hermes-truncated-before-name", "dynamo-hermes-missing-close-tag",
                     "dynamo-kimi-k2-truncated-header-is-text", "dynamo-kimi-k2-truncated-arguments-keep-what-streamed",
                     "dynamo-kimi-k2-empty-section-is-text", "dynamo-llama3-malformed-after-tag",
                     "dynamo-minimax-m2-truncated-invoke-is-text", "dynamo-minimax-m2-truncated-value-is-closed",
                     "dynamo-minimax-m2-invoke-without-name-is-text", "dynamo-mistral-malformed-list",
                     "dynamo-mistral-truncated-name", "dynamo-qwen3-coder-truncated-in-value-is-closed",
                     "dynamo-qwen3-coder-truncated-header-is-text", "dynamo-qwen3-coder-empty-name-is-text",
                     "dynamo-qwen3-coder-json-inside-tool-call-is-text", "dynamo-granite-truncated-thought"), CUT_OFF),
    **dict.fromkeys(("dynamo-llama3-two-calls-semicolon", "dynamo-pythonic-python-start",
                     "dynamo-minimax-m2-missing-section-end-text-after-is-content", "dynamo-deepseek-v32-text-before",
                     "dynamo-qwen3-coder-multiline-string-kept-exactly", "dynamo-granite-no-thinking-is-content",
                     "dynamo-kimi-k2-tool-section-without-tools-is-content"), TEXT_AROUND),
    **dict.fromkeys(("dynamo-deepseek-v32-no-string-attribute-uses-schema", "dynamo-minimax-m2-every-type",
                     "dynamo-qwen3-coder-every-type", "dynamo-qwen3-coder-unconvertible-values-stay-strings"), TYPES),
    "dynamo-hermes-string-arguments": "arguments given as a JSON string: Dynamo passes the string on, double-encoded",
    "dynamo-pythonic-two-calls-types": "a negative number argument (g=-2.5): Dynamo drops the argument",
    "dynamo-pythonic-not-a-literal": "a non-literal argument (x=foo.bar): Dynamo drops it; we keep its source text",
    **dict.fromkeys(("dynamo-kimi-k2-reasoning-first", "kimi-k2-no-open-tag"), STRAY_MARKER),
    "dynamo-qwen3-think-later-is-content": "a <think> block after the answer began: Dynamo moves it to reasoning",
    **dict.fromkeys(("dynamo-harmony-analysis-final", "dynamo-harmony-tool-call",
                     "dynamo-harmony-recipient-before-channel", "dynamo-harmony-preamble-and-two-calls",
                     "dynamo-harmony-plain-text", "dynamo-harmony-builtin-tool-is-reasoning",
                     "dynamo-harmony-no-tools-offered"), HARMONY),
    **dict.fromkeys(("dynamo-mistral-args-form", "dynamo-mistral-args-form-two", "dynamo-mistral-call-id",
                     "dynamo-magistral-reasoning-then-args-form-calls"), MISTRAL_ARGS),
    "thinking-off-nemotron-block": "thinking off: Dynamo strips <think> but leaves </think> in the content",
    "opt-in-deepseek-v3-default": ("thinking off on an opt-in family: a block the model writes anyway is separated, as "
                                   "for Qwen3; Dynamo leaves the markers in the content"),
    **dict.fromkeys(("minimax-m3-default", "minimax-m3-plain"),
                    "Dynamo's minimax_m3 parser returns nothing at all for this output (content and reasoning empty)"),
    # Issue 37's new names (deepseek_v4, gemma4, inkling, kimi_k3, minimax_m3, reasoning_families, wrapped_json).
    **dict.fromkeys(("dynamo-deepseek-v4-cut-off", "dynamo-gemma4-cut-off-in-string", "dynamo-gemma4-cut-off-in-list",
                     "dynamo-gemma4-no-call-prefix-is-text", "dynamo-gemma4-no-brace-is-text",
                     "dynamo-inkling-broken-call-is-text", "dynamo-inkling-call-cut-off", "dynamo-kimi-k3-cut-off-call",
                     "dynamo-minimax-m3-cut-off", "dynamo-minimax-m3-broken-before-name",
                     "dynamo-nemotron-deci-cut-off"), CUT_OFF),
    **dict.fromkeys(("dynamo-inkling-tools-alone", "dynamo-default-toolcall", "dynamo-jamba-other-tag-is-text"),
                    TEXT_AROUND),
    **dict.fromkeys(("dynamo-inkling-plain-answer", "dynamo-inkling-tool-text-block-is-visible",
                     "dynamo-phi4-word-in-prose", "dynamo-nemotron-deci-not-json-is-text",
                     "dynamo-default-list-of-numbers-is-content"), LOST_TEXT),
    **dict.fromkeys(("dynamo-deepseek-v4-self-closing-invoke", "dynamo-deepseek-v41-self-closing-and-text-before",
                     "dynamo-deepseek-v41-reasoning-ended-by-calls"), SELF_CLOSING),
    **dict.fromkeys(("dynamo-deepseek-v4-reasoning-then-call", "dynamo-deepseekv4-thinking"), STRAY_MARKER),
    **dict.fromkeys(("dynamo-minimax-m3-adaptive-plain-answer", "dynamo-minimax-m3-thinking-enabled-prompt-opened"),
                    M3_REASONING_FIRST),
    "dynamo-gemma4-scalars": "a Gemma 4 bare word that is no JSON scalar (word:maybe): Dynamo sends {} for the call",
    "dynamo-kimi-k3-prompt-opened-think": ("Kimi K3 thinks by default: Dynamo's kimi_k3 splits only a block the output "
                                           "opens, so reasoning the prompt opened joins the answer as content"),
    "dynamo-inkling-thinking-into-call": ("a JSON tool block ending an open thinking block: Dynamo leaves marker and "
                                          "call in the reasoning; we end the reasoning and read the call"),
    **dict.fromkeys(("dynamo-minimax-append-think", "dynamo-minimax-append-think-no-end"),
                    "minimax_append_think: Dynamo 1.6.1 prepends <think> and splits nothing (markers left in content)"),
    "dynamo-minimax-m3-untyped-nested": ("M3 <item> elements without a schema: Dynamo makes them an object's 'item' "
                                         "key; we read an array and JSON's literals (SGLang's rule)"),
    "dynamo-minimax-m3-spaced-tags-and-text-before": ("layout whitespace between M3's namespace token and a tag: "
                                                      "Dynamo leaves the whole call as text; SGLang and we read it"),
}


def load() -> list[dict]:
    cases = []
    for path in sorted(GOLDEN_DIR.glob("*.json")):
        cases += json.loads(path.read_text())["cases"]
    return cases


CASES = load()


def ours(case: dict, key: str) -> str:
    """Meshfront's name for the case's parser (the case file's ``meshfront`` where it differs from Dynamo's)."""
    return case["meshfront"].get(key, case[key])


def config(case: dict) -> ParserConfig:
    """The parser configuration the mesh derives from the recorded request."""
    request = case["request"]
    kwargs = dict(request.get("chat_template_kwargs") or {})
    effort = request.get("reasoning_effort")
    if effort == "none":  # the gateway's rule (services/gateway/core/openai_fields.py)
        kwargs["enable_thinking"] = False
    elif effort is not None:
        kwargs["reasoning_effort"] = effort
    kwargs = apply_default_thinking_mode(kwargs, case["default_thinking_mode"])
    reasoning = ours(case, "reasoning_parser")
    tool_choice = request.get("tool_choice", "auto")
    return ParserConfig(tool_call_parser=ours(case, "tool_call_parser"), reasoning_parser=reasoning,
                        has_tools=bool(case["tools"]), tool_choice=ToolChoice(tool_choice),
                        prompt_opens_reasoning=(prompt_opens_reasoning(case["prompt_tail"])
                                                or forces_reasoning(reasoning, kwargs)),
                        thinking_disabled=bool(reasoning) and thinking_off(reasoning, kwargs))


def normal(split: dict | Result) -> tuple[str, str, list]:
    """(content, reasoning, calls) up to surrounding whitespace, arguments as parsed JSON."""
    if isinstance(split, Result):
        content, reasoning, calls = split.content, split.reasoning, split.calls
    else:
        content, reasoning, calls = split["content"], split["reasoning"], split["calls"]
    return content.strip(), reasoning.strip(), [[name, parsed(args)] for name, args in calls]


def parsed(arguments: str):
    """A call's arguments as JSON, or the text where they are not JSON (a cut-off call)."""
    try:
        return json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return arguments


def missing_name(case: dict) -> str:
    tool, reasoning = ours(case, "tool_call_parser"), ours(case, "reasoning_parser")
    if tool and case["tools"] and tool not in TOOL_CALL_PARSERS:
        return f"tool-call parser {tool!r}"
    if reasoning and reasoning not in REASONING_NAMES:
        return f"reasoning parser {reasoning!r}"
    return ""


def params() -> list:
    out = []
    for case in CASES:
        marks = [pytest.mark.xfail(strict=True, reason=DIFFERENCES[case["id"]])] if case["id"] in DIFFERENCES else []
        out.append(pytest.param(case, id=case["id"], marks=marks))
    return out


@pytest.mark.parametrize("case", params())
def test_split_equals_dynamos(case):
    # Every name Dynamo replays is one Meshfront registers (issue 37): a golden for a name it lacks is a failure.
    assert not (name := missing_name(case)), f"{name} has a Dynamo golden but no Meshfront parser"
    cfg = config(case)
    streamed = run(cfg, case["chunks"], json.dumps(case["tools"]) if case["tools"] else "")
    whole = run(cfg, [case["text"]], json.dumps(case["tools"]) if case["tools"] else "")
    assert normal(streamed) == normal(case["streamed"])
    assert normal(whole) == normal(case["whole"])


def test_goldens_are_dynamos_and_cover_every_name_meshfront_had():
    """Every golden says Dynamo 1.6.1 made it, and the names Meshfront had before issue 37 all have cases."""
    docs = [json.loads(p.read_text()) for p in sorted(GOLDEN_DIR.glob("*.json"))]
    assert docs and all(d["dynamo"] == "1.6.1" and d["generated_by"] == "tools/dynamo_replay.py" for d in docs)
    tools = {ours(c, "tool_call_parser") for c in CASES if c["tools"]}
    reasoning = {ours(c, "reasoning_parser") for c in CASES}
    assert {"hermes", "llama3_json", "mistral", "pythonic", "deepseek_v3", "deepseek_v3_1", "deepseek_v32",
            "harmony", "qwen3_coder", "kimi_k2", "glm45", "glm47", "minimax_m2"} <= tools
    assert {"basic", "qwen3", "glm45", "deepseek_r1", "mistral", "kimi", "kimi_k2", "minimax", "nemotron",
            "granite", "gpt_oss"} <= reasoning
