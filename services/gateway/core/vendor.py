"""Root-level chat fields that clients send to vLLM, SGLang and hosted open-model APIs to switch thinking.

- ``thinking``: ``{"type": "enabled" | "disabled" | "auto", "budget_tokens": N}`` (the shape
  DeepSeek, GLM/Z.ai and Anthropic-compatible clients send) or a plain boolean;
- ``enable_thinking``: a boolean (Qwen/DashScope clients send it at the root).

Both become the chat template variables the common reasoning templates read (``enable_thinking``
for Qwen3 and GLM, ``thinking`` for DeepSeek V3.1 and Kimi), so the prompt opens or skips the
thinking block exactly as ``chat_template_kwargs`` would; ``budget_tokens`` is the thinking budget
(``max_thinking_tokens``). The other vLLM/SGLang root fields (``top_k``, ``min_p``,
``repetition_penalty``, ``min_tokens``, ``ignore_eos``, ``skip_special_tokens``,
``include_stop_str_in_output``, ``stop_token_ids``, ``chat_template_kwargs``, structured outputs)
are read with the sampling fields in requests.py and structured.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from services.common.errors import InvalidRequest
from services.gateway.core.fields import UINT32, Fields

THINKING_TYPES = ("enabled", "disabled", "auto")


@dataclasses.dataclass
class VendorOptions:
    template_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    max_thinking_tokens: int | None = None


def _thinking_on(out: VendorOptions, on: bool) -> None:
    out.template_kwargs["enable_thinking"] = on
    out.template_kwargs["thinking"] = on


def parse_vendor_chat_fields(f: Fields) -> VendorOptions:
    out = VendorOptions()
    enable = f.raw("enable_thinking")
    if enable is not None:
        _thinking_on(out, f.bool("enable_thinking"))
    thinking = f.raw("thinking")
    if isinstance(thinking, bool):
        _thinking_on(out, thinking)
    elif isinstance(thinking, dict):
        t = Fields(thinking, "thinking.")
        kind = t.str("type", required=True, allowed=THINKING_TYPES)
        out.max_thinking_tokens = t.int("budget_tokens", UINT32, 1)
        t.reject_unknown()
        if kind != "auto":
            _thinking_on(out, kind == "enabled")
    elif thinking is not None:
        raise InvalidRequest("'thinking' must be a boolean or an object with a type (enabled, disabled, auto)",
                             param="thinking")
    if enable is not None and isinstance(thinking, (bool, dict)) and out.template_kwargs.get("enable_thinking") \
            != enable:
        raise InvalidRequest("'thinking' and 'enable_thinking' disagree", param="thinking")
    return out
