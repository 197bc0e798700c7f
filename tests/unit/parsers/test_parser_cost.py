"""Parsers do work proportional to the new text: a 50k-character argument is not quadratic.

Each format parses a call whose arguments hold an N-character string (plus, for the reasoning
parsers, N characters of reasoning), fed in 4-character chunks as a token stream would arrive. The
time for N = 50 000 must stay within a generous multiple of ten times the N = 5 000 time (linear
scaling gives 10x, quadratic 100x); the best of three runs, in the thread's CPU time, keeps the bound
robust on a loaded CI machine (wall time counted the preemptions: 240x under eight busy neighbours).
"""

from __future__ import annotations

import time

import pytest

from services.postprocessor.core.parsers import ParserConfig, ToolChoice, build_output_parser

pytestmark = pytest.mark.unit

SMALL, LARGE = 5_000, 50_000
CHUNK = 4
# Linear is 10x; quadratic would be 100x. Allow for noise and constant costs.
MAX_RATIO = 40


def _payload(n: int) -> str:
    return ("abc def ü \\\"q\\\" {[]} " * (n // 20 + 1))[:n].rstrip("\\")


FORMATS = {
    "hermes": (ParserConfig("hermes", has_tools=True),
               lambda s: f'<tool_call>\n{{"name": "f", "arguments": {{"data": "{s}"}}}}\n</tool_call>'),
    "llama3_json": (ParserConfig("llama3_json", has_tools=True),
                    lambda s: f'<|python_tag|>{{"name": "f", "parameters": {{"data": "{s}"}}}}'),
    "mistral": (ParserConfig("mistral", has_tools=True), lambda s: f'[TOOL_CALLS]f[ARGS]{{"data": "{s}"}}'),
    "pythonic": (ParserConfig("pythonic", has_tools=True), lambda s: f'[f(data="{s}")]'),
    "deepseek_v3": (ParserConfig("deepseek_v3", has_tools=True),
                    lambda s: ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n"
                               f'{{"data": "{s}"}}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>')),
    "harmony": (ParserConfig("harmony", "gpt_oss", has_tools=True),
                lambda s: (f"<|channel|>analysis<|message|>{s}<|end|><|start|>assistant<|channel|>commentary "
                           f'to=functions.f <|constrain|>json<|message|>{{"data": "{s}"}}<|call|>')),
    "qwen3_coder": (ParserConfig("qwen3_coder", has_tools=True),
                    lambda s: ("<tool_call>\n<function=f>\n<parameter=data>\n"
                               f"{s}\n</parameter>\n</function>\n</tool_call>")),
    "kimi_k2": (ParserConfig("kimi_k2", has_tools=True),
                lambda s: ("<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>"
                           f'{{"data": "{s}"}}<|tool_call_end|><|tool_calls_section_end|>')),
    "glm47": (ParserConfig("glm47", has_tools=True),
              lambda s: f"<tool_call>f<arg_key>data</arg_key><arg_value>{s}</arg_value></tool_call>"),
    "minimax_m2": (ParserConfig("minimax_m2", "minimax", has_tools=True),
                   lambda s: (f'{s}</think><minimax:tool_call><invoke name="f"><parameter name="data">{s}'
                              "</parameter></invoke></minimax:tool_call>")),
    "deepseek_v32": (ParserConfig("deepseek_v32", has_tools=True),
                     lambda s: ('<｜DSML｜function_calls><｜DSML｜invoke name="f"><｜DSML｜parameter name="data" '
                                f'string="true">{s}</｜DSML｜parameter></｜DSML｜invoke></｜DSML｜function_calls>')),
    # Issue 37's formats: DeepSeek V4 DSML, Kimi K3 XTML, MiniMax M3 namespaced tags (a held, untyped value).
    "deepseek_v4": (ParserConfig("deepseek_v4", "deepseek_v4", has_tools=True, prompt_opens_reasoning=True),
                    lambda s: (f'{s}<｜DSML｜tool_calls><｜DSML｜invoke name="f"><｜DSML｜parameter name="data" '
                               f'string="true">{s}</｜DSML｜parameter></｜DSML｜invoke></｜DSML｜tool_calls>')),
    "kimi_k3": (ParserConfig("kimi_k3", "kimi_k3", has_tools=True),
                lambda s: (f"<|open|>think<|sep|>{s}<|close|>think<|sep|><|open|>response<|sep|>{s}"
                           '<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool="f"<|sep|><|open|>argument '
                           f'key="data" type="string"<|sep|>{s}<|close|>argument<|sep|><|close|>call<|sep|>'
                           "<|close|>tools<|sep|>")),
    "minimax_m3": (ParserConfig("minimax_m3", "minimax_m3", has_tools=True),
                   lambda s: (f"<mm:think>{s}</mm:think>]<]minimax[>[<tool_call>]<]minimax[>[<invoke name=\"f\">"
                              f"]<]minimax[>[<data>{s}]<]minimax[>[</data>]<]minimax[>[</invoke>]<]minimax[>[</tool_call>")),
    # Muse Glimmer's channels: a call is sent whole at </atem:invoke>, so its value is held, not quadratic.
    "muse": (ParserConfig("muse", "muse", has_tools=True),
             lambda s: (f" to=self<|message|>{s}<|eom|><|start|>assistant to=f<|message|><atem:function_calls>"
                        f'<atem:invoke name="f"><atem:parameter name="data">{s}</atem:parameter></atem:invoke>'
                        f"</atem:function_calls><|eom|><|start|>assistant to=user<|message|>{s}<|eot|>")),
    "granite": (ParserConfig(reasoning_parser="granite"),
                lambda s: f"Here is my thought process: {s} Here is my response: {s}"),
    "required": (ParserConfig("hermes", has_tools=True, tool_choice=ToolChoice.REQUIRED),
                 lambda s: f'[{{"name": "f", "parameters": {{"data": "{s}"}}}}]'),
    "qwen3+hermes": (ParserConfig("hermes", "qwen3", has_tools=True),
                     lambda s: f'<think>{s}</think><tool_call>{{"name": "f", "arguments": {{"d": "{s}"}}}}'
                               '</tool_call>'),
    "deepseek_r1": (ParserConfig(reasoning_parser="deepseek_r1"), lambda s: f"{s}</think>{s}"),
    # The other current forms and reasoning formats (issue 20), each of its own shape.
    "deepseek_v31": (ParserConfig("deepseek_v31", has_tools=True),
                     lambda s: ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{"data": "'
                                f'{s}"}}<｜tool▁call▁end｜><｜tool▁calls▁end｜>')),
    "mistral_list": (ParserConfig("mistral", "mistral", has_tools=True),
                     lambda s: f'[THINK]{s}[/THINK][TOOL_CALLS][{{"name": "f", "arguments": {{"data": "{s}"}}}}]'),
    "llama4_pythonic": (ParserConfig("llama4_pythonic", has_tools=True),
                        lambda s: f'<|python_start|>[f(data="{s}")]<|python_end|>'),
    "gpt_oss_reasoning": (ParserConfig(reasoning_parser="gpt_oss"),
                          lambda s: f"<|channel|>analysis<|message|>{s}<|end|><|start|>assistant<|channel|>final"
                                    f"<|message|>{s}"),
    "kimi_k2_reasoning": (ParserConfig("kimi_k2", "kimi_k2", has_tools=True),
                          lambda s: (f"{s}<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
                                     f'<|tool_call_argument_begin|>{{"data": "{s}"}}<|tool_call_end|>'
                                     "<|tool_calls_section_end|>")),
    "kimi": (ParserConfig(reasoning_parser="kimi"), lambda s: f"◁think▷{s}◁/think▷{s}"),
    "nemotron": (ParserConfig(reasoning_parser="nemotron"), lambda s: f"{s}</think>{s}"),
}


def _parse_seconds(config: ParserConfig, text: str) -> float:
    best = float("inf")
    for _ in range(3):
        parser = build_output_parser(config)
        assert parser is not None
        start = time.thread_time()  # CPU time: a loaded machine preempting the run does not count
        for i in range(0, len(text), CHUNK):
            parser.feed(text[i:i + CHUNK])
        parser.finish()
        best = min(best, time.thread_time() - start)
    return best


@pytest.mark.parametrize("name", FORMATS)
def test_large_arguments_cost_is_linear(name):
    config, build = FORMATS[name]
    small = _parse_seconds(config, build(_payload(SMALL)))
    large = _parse_seconds(config, build(_payload(LARGE)))
    assert large < MAX_RATIO * small + 0.05, (name, small, large)


@pytest.mark.parametrize("name", FORMATS)
def test_large_arguments_round_trip(name):
    """The 50k payload arrives whole (arguments streamed verbatim, nothing capped)."""
    config, build = FORMATS[name]
    payload = _payload(LARGE)
    parser = build_output_parser(config)
    text = build(payload)
    deltas = [parser.feed(text[i:i + CHUNK]) for i in range(0, len(text), CHUNK)] + [parser.finish()]
    args = "".join(c.arguments for d in deltas for c in d.tool_calls)
    reasoning = "".join(d.reasoning for d in deltas)
    assert len(args) + len(reasoning) >= LARGE
