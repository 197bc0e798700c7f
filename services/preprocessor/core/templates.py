"""Chat template rendering, exactly as transformers' ``apply_chat_template`` renders.

Templates run in transformers' environment, owned in chat_jinja.py (sandboxed, with ``trim_blocks``,
``lstrip_blocks``, ``loopcontrols``, a non-escaping ``tojson``, ``raise_exception``, ``strftime_now``
and hardened ``dict``/``namespace``), so a prompt here is byte-identical to the one
``AutoTokenizer.apply_chat_template(..., tokenize=False)`` gives. Templates only ever come from the
model directory; a request can pass variables (``chat_template_kwargs``) but never a template.
"""

from __future__ import annotations

import logging
from typing import Any

import jinja2

from services.common.errors import InvalidRequest
from services.preprocessor.core import chat_jinja

log = logging.getLogger(__name__)
# What a client hears when the template fails on its messages in a way the template did not explain
# (the gateway checks the messages' shape first, so this is a template expecting something unusual).
CANNOT_RENDER = ("the model's chat template cannot render these messages: a field it reads is missing or "
                 "has an unexpected type")

# Names render_jinja_template takes as parameters, and the template itself: a request may not set
# them through chat_template_kwargs. add_generation_prompt may be overridden (Dynamo merges
# chat_template_args last), so it is handled separately.
_RESERVED_KWARGS = frozenset({
    "messages", "conversations", "tools", "documents", "chat_template", "continue_final_message",
    "return_assistant_tokens_mask",
})


def renders_media_parts(template: str) -> bool:
    """Whether the template walks content parts for images or audio (Qwen2-VL style) rather than
    expecting string content: vLLM's "openai" versus "string" content format, told by the part
    type names the template compares against."""
    return any(f"{q}{kind}{q}" in template for kind in ("image", "audio") for q in ("'", '"'))


def template_reads(template: str, name: str) -> bool:
    """Whether ``template`` mentions variable/attribute ``name`` (Dynamo's reasoning_content probe)."""
    return name in template


def render_chat(template: str, messages: list[dict], tools: list[dict] | None, special_tokens: dict[str, str],
                kwargs: dict[str, Any] | None) -> str:
    """Renders one conversation with the generation prompt.

    Args:
        template: Jinja source from the model directory.
        messages: normalised messages (see ``messages.normalise_messages``).
        tools: normalised tools, or None to give the template no tools.
        special_tokens: bos/eos/unk/pad token strings, visible to the template as transformers exposes them.
        kwargs: the request's chat_template_kwargs, merged last.
    """
    extra = dict(kwargs or {})
    bad = sorted(_RESERVED_KWARGS & extra.keys())
    if bad:
        raise InvalidRequest(f"chat_template_kwargs may not set {', '.join(bad)}", param="chat_template_kwargs")
    add_generation_prompt = bool(extra.pop("add_generation_prompt", True))
    context = {**special_tokens, **extra}
    try:
        return chat_jinja.render(template, messages, list(tools) if tools else None, add_generation_prompt, context)
    except jinja2.TemplateError as e:
        if type(e) is jinja2.TemplateError:  # raise_exception(): the template author's words, for the client
            raise InvalidRequest(f"chat template error: {e}", param="messages") from e
        # Undefined names, sandbox violations: Jinja's text names Python types ('str object' has no attribute).
        log.info("the chat template failed on a request's messages: %r", e)
        raise InvalidRequest(CANNOT_RENDER, param="messages") from e
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
        log.info("the chat template failed on a request's messages: %r", e)
        raise InvalidRequest(CANNOT_RENDER, param="messages") from e


def prompt_opens_reasoning(prompt: str) -> bool:
    """The prompt ends inside an opened ``<think>`` block, so output starts as reasoning."""
    return prompt.rstrip().endswith("<think>")
