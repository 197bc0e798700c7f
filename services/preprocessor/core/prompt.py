"""From a chat or completions prompt to validated token ids (dynamo-frontend.md §3.2-3.4).

Pure functions over plain values; ``service.py`` maps protos onto them.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Mapping, Sequence
from typing import Any

from services.common.errors import InvalidRequest
from services.preprocessor.core import messages as msgs
from services.preprocessor.core.artifacts import ModelArtifacts
from services.preprocessor.core.prefix_cache import PrefixCache
from services.preprocessor.core.templates import (
    prompt_opens_reasoning,
    render_chat,
    renders_media_parts,
    template_reads,
)

MAX_STOP_STRINGS = 32
# Above this many characters the Rust encoder runs through encode_batch, which releases the GIL,
# so a caller on a worker thread does not stall the event loop. Below it a plain encode is faster.
GIL_FREE_ENCODE_CHARS = 16_384


@dataclasses.dataclass(frozen=True)
class PreparedPrompt:
    token_ids: list[int]
    prompt_opens_reasoning: bool = False
    text: str = ""  # the rendered chat prompt (nvext annotation formatted_prompt)
    # time.time_ns() when the chat template was rendered (0: no template): splits the trace's template
    # and tokenize spans. One clock read per request.
    rendered_ns: int = 0


@dataclasses.dataclass(frozen=True)
class ChatInput:
    """The chat request's JSON strings as they arrive (empty string = absent)."""

    messages_json: str
    tools_json: str = ""
    tool_choice_none: bool = False  # tool_choice "none"
    chat_template_kwargs_json: str = ""
    # Dynamo's exclude_tools_when_tool_choice_none: tool_choice "none" hides the tools from the template.
    hide_tools_for_choice_none: bool = True
    # The deployment's --chat-template, used instead of the model directory's; empty for none.
    template_override: str = ""
    # Placeholder text per modality for templates that render no media parts (media/placement.py).
    media_markers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # The function a named tool_choice forces, else empty (SGLang's renderer shows the template only that tool).
    tool_choice_name: str = ""

    def size(self) -> int:
        return len(self.messages_json) + len(self.tools_json)


def encode(artifacts: ModelArtifacts, text: str) -> list[int]:
    """Token ids of ``text`` with no special tokens added (templates supply them); NULs removed."""
    if "\0" in text:
        text = text.replace("\0", "")
    if len(text) > GIL_FREE_ENCODE_CHARS:
        return artifacts.encoder.encode_batch([text], add_special_tokens=False)[0].ids
    return artifacts.encoder.encode(text, add_special_tokens=False).ids


def _optional_json(raw: str, name: str) -> Any:
    return msgs.parse_json(raw, name, name) if raw else None


def render_chat_prompt(artifacts: ModelArtifacts, chat: ChatInput) -> str:
    """The rendered prompt text for a chat request."""
    raw_tools = _optional_json(chat.tools_json, "tools")
    hidden = chat.hide_tools_for_choice_none and chat.tool_choice_none
    tools = [] if hidden else msgs.normalise_tools(raw_tools)
    template = chat.template_override or artifacts.template_for(has_tools=bool(tools))
    if template is None:
        raise InvalidRequest(f"model directory {artifacts.model_dir} has no chat template; use /v1/completions",
                             param="messages")
    messages = msgs.normalise_messages(msgs.parse_json(chat.messages_json, "messages", "messages"),
                                       template_reads(template, "reasoning_content"), renders_media_parts(template),
                                       chat.media_markers)
    kwargs = _optional_json(chat.chat_template_kwargs_json, "chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise InvalidRequest("chat_template_kwargs must be an object", param="chat_template_kwargs")
    return render_chat(template, messages, tools or None, artifacts.special_tokens, kwargs)


def prepare_chat(artifacts: ModelArtifacts, chat: ChatInput, context_length: int = 0,
                 max_tokens: int | None = None, prefix_cache: PrefixCache | None = None) -> PreparedPrompt:
    """``context_length`` (0: unknown) and ``max_tokens`` refuse a prompt that surely cannot fit before it is
    encoded (refuse_surely_too_long); the exact check follows encoding (check_context). ``prefix_cache``: an
    earlier turn's ids are reused (prefix_cache.py); the ids are the same as without it."""
    prompt = render_chat_prompt(artifacts, chat)
    rendered_ns = time.time_ns()
    refuse_surely_too_long(artifacts, prompt, context_length, max_tokens, "messages")
    if prefix_cache is None:
        ids = encode(artifacts, prompt)
    else:
        ids = prefix_cache.encode(artifacts.model_dir, artifacts.encoder, artifacts.prefix_cuts, prompt,
                                  functools.partial(encode, artifacts))
    return PreparedPrompt(ids, prompt_opens_reasoning(prompt), prompt, rendered_ns)


def prepare_text(artifacts: ModelArtifacts, text: str, context_length: int = 0,
                 max_tokens: int | None = None) -> PreparedPrompt:
    refuse_surely_too_long(artifacts, text, context_length, max_tokens, "prompt")
    ids = encode(artifacts, text)
    if not ids:
        raise InvalidRequest("the prompt is empty", param="prompt")
    return PreparedPrompt(ids)


def prepare_tokens(artifacts: ModelArtifacts, ids: Sequence[int]) -> PreparedPrompt:
    if not ids:
        raise InvalidRequest("the prompt is empty", param="prompt")
    top = max(ids)
    if top >= artifacts.vocab_size:
        raise InvalidRequest(f"token id {top} is out of range for this model's vocabulary of "
                             f"{artifacts.vocab_size} tokens", param="prompt")
    return PreparedPrompt(list(ids))


def refuse_surely_too_long(artifacts: ModelArtifacts, text: str, context_length: int, max_tokens: int | None,
                           param: str) -> None:
    """Refuses a text that surely cannot fit before encoding all of it: a 10 MB prompt is refused in
    milliseconds instead of holding a preprocessor for seconds. Never refuses one that fits (the floor
    is sound, length_floor.py); below a size that encodes quickly it does not even look."""
    if context_length <= 0 or len(text) < GIL_FREE_ENCODE_CHARS:
        return
    fewest = artifacts.fewest_tokens(text, context_length - (max_tokens or 0))
    if fewest == 0:
        return  # no floor: the count after encoding decides
    if fewest >= context_length or (max_tokens is not None and fewest + max_tokens > context_length):
        noun = "messages" if param == "messages" else "prompt"
        raise InvalidRequest(
            f"This model's maximum context length is {context_length} tokens. However, your {noun} "
            f"({len(text.encode('utf-8', 'surrogatepass'))} bytes) cannot be fewer than {fewest} tokens"
            + (f", and {max_tokens} more were requested for the completion" if max_tokens is not None else "")
            + f". Please reduce the length of the {noun}" + (" or completion." if max_tokens is not None else "."),
            param=param, code="context_length_exceeded")


def check_context(prompt_tokens: int, context_length: int, max_tokens: int | None, param: str) -> None:
    """Rejects prompts that do not fit the context window (0 = unknown, no check).

    The first message is Dynamo's; the second follows vLLM/OpenAI for prompt + max_tokens, which
    Dynamo does not check but OpenAI clients expect as a 400 rather than a truncated reply.
    """
    if context_length <= 0:
        return
    noun = "messages" if param == "messages" else "prompt"
    if prompt_tokens >= context_length:
        raise InvalidRequest(
            f"This model's maximum context length is {context_length} tokens. However, your {noun} resulted in "
            f"{prompt_tokens} tokens. Please reduce the length of the {noun}.",
            param=param, code="context_length_exceeded")
    if max_tokens is not None and prompt_tokens + max_tokens > context_length:
        raise InvalidRequest(
            f"This model's maximum context length is {context_length} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the {noun}, {max_tokens} in the completion). "
            f"Please reduce the length of the {noun} or completion.",
            param=param, code="context_length_exceeded")


def check_stop_strings(stop: Sequence[str]) -> None:
    if len(stop) > MAX_STOP_STRINGS:
        raise InvalidRequest(f"at most {MAX_STOP_STRINGS} stop sequences are allowed, got {len(stop)}", param="stop")


def hidden_stop_ids(requested: Sequence[int], eos_ids: Sequence[int], ignore_eos: bool) -> list[int]:
    """Stop ids the worker hides: the request's own plus the model's EOS ids unless ignore_eos."""
    out = list(dict.fromkeys(requested))
    if not ignore_eos:
        out.extend(i for i in eos_ids if i not in out)
    return out
