"""A chat engine factory that applies a small policy to every chat model's requests and answers:

- pre-hook: a request mentioning ``BLOCKED_PHRASE`` is refused (403, OpenAI's ``permission_error``), and no
  answer is longer than ``MAX_TOKENS`` tokens (``max_tokens`` / ``max_completion_tokens`` capped, or set);
- post-hook: every chunk (each streamed ``chat.completion.chunk``, or the whole ``chat.completion``) carries
  ``system_fingerprint: FINGERPRINT``, so a client can tell the policy served it.

Load it with ``--chat-engine-factory examples.engine_factory.policy:factory``.
"""

from __future__ import annotations

from typing import Any

from services.gateway.extensions import ChatHooks, ExtensionError, ModelInfo

BLOCKED_PHRASE = "open the pod bay doors"
MAX_TOKENS = 4
FINGERPRINT = "policy-example"


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # content parts: only the text ones are read
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def pre(request: dict[str, Any]) -> dict[str, Any]:
    messages = request.get("messages")
    if isinstance(messages, list) and any(BLOCKED_PHRASE in _text(m).lower() for m in messages
                                          if isinstance(m, dict)):
        raise ExtensionError(403, "This request is refused by the deployment's policy", param="messages",
                             code="policy_refused")
    capped = False
    for key in ("max_tokens", "max_completion_tokens"):
        if type(request.get(key)) is int:  # other types (null, a bool): the gateway's own check answers them
            request[key] = min(request[key], MAX_TOKENS)
            capped = True
    if not capped:
        request["max_completion_tokens"] = MAX_TOKENS
    return request


def post(chunk: dict[str, Any]) -> dict[str, Any]:
    chunk["system_fingerprint"] = FINGERPRINT
    return chunk


def factory(model: ModelInfo) -> ChatHooks | None:
    """Called once per chat model as it appears; None would serve the model without hooks."""
    return ChatHooks(pre=pre, post=post)
