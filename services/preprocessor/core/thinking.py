"""Whether a request thinks: the deployment default, then each family's rule (Dynamo 1.6.1's, issue 37).

Two steps, both pure:

1. ``apply_default_thinking_mode`` merges the deployment default (a worker's
   ``--dyn-default-thinking-mode``, carried on its model card as Dynamo carries it in the card's runtime
   data) into the request's ``chat_template_kwargs`` before the template renders, unless the request
   already says something about thinking. ``enabled``/``disabled`` set ``thinking``,
   ``enable_thinking`` and ``thinking_mode`` together, because templates read different ones.
2. ``thinking_off`` decides, from the model's reasoning parser and the merged kwargs, whether the
   output starts without reasoning. The postprocessor then drops a reasoning parser whose format starts
   in reasoning (DeepSeek R1, MiniMax, Nemotron, Mistral), and keeps one that needs the model to open
   its block (Qwen3, GLM, Kimi, Granite, Kimi K2): a block the model still writes is separated, as
   Dynamo does. ``forces_reasoning``: an opt-in family asked to think starts in reasoning whatever the
   template printed (Dynamo forces it; DeepSeek's own templates end the prompt with ``<think>`` then).

The family rules are those of Dynamo's ``resolve_request_force_reasoning``, checked against Dynamo's own
frontend by ``tools/dynamo_replay.py`` (tests/golden/parsers/dynamo/thinking.json):

- Mistral thinks only when ``reasoning_effort`` is given and is not ``"none"``;
- MiniMax M3 thinks (adaptively) unless ``thinking_mode`` is ``"disabled"``;
- opt-in families think only when asked: DeepSeek V3/V4 by ``thinking: true``, Gemma 4 by
  ``enable_thinking: true``;
- Kimi K2/K3 stop thinking on ``thinking: false``;
- every other family thinks unless ``enable_thinking: false``, ``thinking: false`` or a
  ``thinking_mode`` of ``"chat"`` / ``"disabled"`` says otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

THINKING_MODES = ("enabled", "disabled")
# The kwargs a request controls thinking with; any of them keeps the deployment default out.
THINKING_CONTROL_KEYS = ("thinking", "enable_thinking", "thinking_mode", "reasoning_effort")
MISTRAL = frozenset({"mistral"})
MINIMAX_ADAPTIVE = frozenset({"minimax_m3", "minimax-m3", "minimax_m3_nom", "minimax-m3-nom"})
# Opt-in families and the kwarg that turns their thinking on.
OPT_IN = {**dict.fromkeys(("deepseek_v3", "deepseek-v4", "deepseek_v4", "deepseekv4", "deepseek_v41"), "thinking"),
          **dict.fromkeys(("gemma4", "gemma-4"), "enable_thinking")}
KIMI_THINKING_FLAG = frozenset({"kimi_k2", "kimi_k25", "kimi_k3", "kimi-k3"})


def apply_default_thinking_mode(kwargs: Mapping[str, Any], default_mode: str) -> dict[str, Any]:
    """``kwargs`` with the deployment's default thinking mode merged in, unless the request controls thinking.

    Args:
        kwargs: the request's chat_template_kwargs (``reasoning_effort`` folded in by the gateway).
        default_mode: ``"enabled"``, ``"disabled"`` or ``""`` (no default). Workers validate it at start.
    """
    out = dict(kwargs)
    if not default_mode or any(key in out for key in THINKING_CONTROL_KEYS):
        return out
    enabled = default_mode == "enabled"
    out.update(thinking=enabled, enable_thinking=enabled, thinking_mode=default_mode)
    return out


def thinking_off(reasoning_parser: str, kwargs: Mapping[str, Any]) -> bool:
    """Whether this request's output starts without reasoning, by its model's family rule (module doc)."""
    if reasoning_parser in MISTRAL:
        effort = kwargs.get("reasoning_effort")
        return effort is None or effort == "none"
    if reasoning_parser in MINIMAX_ADAPTIVE:
        return kwargs.get("thinking_mode") == "disabled"
    if reasoning_parser in OPT_IN:
        return kwargs.get(OPT_IN[reasoning_parser]) is not True
    if reasoning_parser in KIMI_THINKING_FLAG:
        return kwargs.get("thinking") is False
    return (kwargs.get("enable_thinking") is False or kwargs.get("thinking") is False
            or kwargs.get("thinking_mode") in ("chat", "disabled"))


def forces_reasoning(reasoning_parser: str, kwargs: Mapping[str, Any]) -> bool:
    """An opt-in family (DeepSeek V3/V4) asked to think: its output starts inside the reasoning block."""
    flag = OPT_IN.get(reasoning_parser)
    return flag == "thinking" and kwargs.get(flag) is True
