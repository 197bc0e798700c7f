"""Chat renderers: who turns a chat request into prompt token ids (``--chat-processor``).

``ours`` (the default) is this package's path: transformers' Jinja rendering (templates.py) and the
Rust ``tokenizers`` encoder (prompt.py). ``vllm`` renders and tokenizes with vLLM's own renderer, the
one ``vllm serve``'s chat endpoint uses, and ``sglang`` with SGLang's own chat handler, so a prompt's
ids are exactly the engine's (a model whose engine renderer is not plain Jinja, a tokenizer the engine
loads differently). The engines are optional extras: an engine's module is imported only by
``load_chat_renderer`` when selected, at startup, and the preprocessor then runs from the engine's
environment (the launcher starts it with that python).
The postprocessor's flag of the same name selects whose output parsers run
(services/postprocessor/core/parsers/backends/).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Protocol

from services.preprocessor.core import prompt as core
from services.preprocessor.core.artifacts import ModelArtifacts
from services.preprocessor.core.prefix_cache import PrefixCache

DEFAULT_CHAT_PROCESSOR = "ours"
# --tokenizer-prefix-cache-bytes: about 500 eight-turn conversations of 6k tokens (text, and ids at 36 bytes).
DEFAULT_PREFIX_CACHE_BYTES = 128 << 20

# name -> (the distribution's top-level module, the adapter module, the extra that installs it).
_ENGINE_RENDERERS = {
    "vllm": ("vllm", "services.preprocessor.core.renderers.vllm", "vllm"),
    "sglang": ("sglang", "services.preprocessor.core.renderers.sglang", "sglang"),
}
CHAT_PROCESSORS = (DEFAULT_CHAT_PROCESSOR, *_ENGINE_RENDERERS)


class ChatRendererUnavailable(RuntimeError):
    """The selected chat renderer's engine is not installed (or does not import)."""


class ChatRenderer(Protocol):
    """Renders and tokenizes one chat request (service.py calls it, on a thread for large prompts)."""

    name: str

    def warm(self, artifacts: ModelArtifacts) -> None:
        """Loads what rendering ``artifacts.model_dir`` needs (blocking), ahead of its first request."""

    def prepare_chat(self, artifacts: ModelArtifacts, chat: core.ChatInput, context_length: int = 0,
                     max_tokens: int | None = None) -> core.PreparedPrompt:
        """The prompt's ids and text; raises ``InvalidRequest`` for what the client must change."""


class OursChatRenderer:
    """The default: transformers' Jinja rendering and the ``tokenizers`` encoder (prompt.py), reusing an
    earlier turn's ids through the prefix cache (prefix_cache.py; 0 bytes: none). The engines' renderers
    tokenize inside the engine's own code, where a cache of ours cannot reach."""

    name = DEFAULT_CHAT_PROCESSOR

    def __init__(self, prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES):
        self.prefix_cache = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes > 0 else None

    def warm(self, artifacts: ModelArtifacts) -> None:
        return None  # the artifacts are all it needs

    def prepare_chat(self, artifacts: ModelArtifacts, chat: core.ChatInput, context_length: int = 0,
                     max_tokens: int | None = None) -> core.PreparedPrompt:
        return core.prepare_chat(artifacts, chat, context_length, max_tokens, self.prefix_cache)


def load_chat_renderer(name: str, prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES) -> ChatRenderer:
    """The chat renderer called ``name``; meant to run once at startup.

    Raises:
        ValueError: ``name`` is not one of ``CHAT_PROCESSORS``.
        ChatRendererUnavailable: its engine is not installed or fails to import.
    """
    if name == DEFAULT_CHAT_PROCESSOR:
        return OursChatRenderer(prefix_cache_bytes)
    if name not in _ENGINE_RENDERERS:
        raise ValueError(f"unknown chat processor {name!r} for the preprocessor; choose one of "
                         f"{', '.join(CHAT_PROCESSORS)}")
    package, module, extra = _ENGINE_RENDERERS[name]
    if importlib.util.find_spec(package) is None:
        raise ChatRendererUnavailable(
            f"--chat-processor {name} needs {package}, which is not installed in this environment: run the "
            f"preprocessor from the engine's environment (meshfront run does), install the extra "
            f"(pip install 'meshfront[{extra}]', see docs/parsers.md) or use --chat-processor {DEFAULT_CHAT_PROCESSOR}")
    try:
        adapter = importlib.import_module(module)
    except ImportError as e:
        raise ChatRendererUnavailable(
            f"--chat-processor {name}: {package} is installed but does not import: {e}") from e
    return adapter.CHAT_RENDERER_CLASS()
