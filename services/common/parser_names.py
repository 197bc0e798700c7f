"""The output-parser names a worker may register (``--tool-call-parser``, ``--reasoning-parser``).

Workers check their flags against these at start, so a typo fails the worker instead of every request
it serves quietly going unparsed. The postprocessor's registries (services/postprocessor/core/parsers)
implement exactly these names; tests/unit/parsers/test_parser_names.py keeps the two equal. With
``--chat-processor vllm|sglang`` the postprocessor maps the same names onto the engine's own parsers;
a name only an engine knows is refused too, because a worker cannot know which backend the
postprocessors behind it run (docs/parsers.md). The env twins are checked like the flags.
"""

from __future__ import annotations

TOOL_CALL_PARSER_NAMES = (
    "hermes", "qwen", "qwen25", "qwen3",
    "llama3_json", "llama",
    "mistral",
    "pythonic", "llama4_pythonic",
    "deepseek_v3", "deepseek_v3_1", "deepseek_v31", "deepseek_r1",
    "deepseek_v32", "deepseek_v3_2",
    "deepseek_v4", "deepseek-v4", "deepseekv4", "deepseek_v41",
    "harmony", "gpt_oss",
    "qwen3_coder",
    "kimi_k2", "kimi_k25", "kimi_k3", "kimi-k3",
    "glm45", "glm47",
    "minimax_m2", "minimax_m3", "minimax-m3", "minimax_m3_nom", "minimax-m3-nom",
    "default", "nemotron_deci", "nemotron_nano", "phi4", "jamba",
    "gemma4", "gemma-4", "inkling",
    "muse", "muse_glimmer",
)

REASONING_PARSER_NAMES = ("basic", "qwen3", "glm45", "deepseek_r1", "mistral", "kimi", "gpt_oss",
                          "deepseek_v3", "deepseek_v3_1", "deepseek_v3_2", "deepseek_v4", "deepseek-v4",
                          "deepseekv4", "deepseek_v41", "kimi_k25", "kimi_k3", "kimi-k3", "minimax_m2",
                          "minimax_m3", "minimax-m3", "minimax_append_think", "glm47", "qwen3_coder", "step3",
                          "kimi_k2", "minimax", "nemotron", "granite",
                          "nemotron3", "nemotron_v3", "nemotron_nano", "nemotron_deci",
                          "gemma4", "gemma-4", "inkling", "muse", "muse_glimmer")

# Each reasoning parser's thinking block, as (opening marker, closing marker): what the workers look up in
# the model's vocabulary to enforce a thinking budget (max_thinking_tokens) by forcing the closing marker
# once the budget is spent (services/workers/thinking_budget.py). A parser missing here ends thinking at
# something no single token can be forced to: Granite's plain-text headers, gpt-oss's Harmony channel
# switch. tests/unit/parsers/test_parser_names.py keeps these equal to the postprocessor's parsers.
THINKING_BLOCKS: dict[str, tuple[str, str]] = {
    **dict.fromkeys(("basic", "qwen3", "glm45", "deepseek_r1", "kimi_k2", "minimax", "nemotron",
                     "nemotron3", "nemotron_v3", "nemotron_nano", "nemotron_deci"),
                    ("<think>", "</think>")),
    "mistral": ("[THINK]", "[/THINK]"),
    "kimi": ("◁think▷", "◁/think▷"),
    **dict.fromkeys(("gemma4", "gemma-4"), ("<|channel>", "<channel|>")),
    **dict.fromkeys(("deepseek_v3", "deepseek_v3_1", "deepseek_v3_2", "deepseek_v4", "deepseek-v4", "deepseekv4",
                     "deepseek_v41", "kimi_k25", "minimax_m2", "minimax_append_think", "glm47", "qwen3_coder",
                     "step3"), ("<think>", "</think>")),
    **dict.fromkeys(("kimi_k3", "kimi-k3"), ("<|open|>think<|sep|>", "<|close|>think<|sep|>")),
    **dict.fromkeys(("minimax_m3", "minimax-m3"), ("<mm:think>", "</mm:think>")),
}
