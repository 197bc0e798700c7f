"""Chat-processor backends: whose parsers turn a model's text into content, reasoning and tool calls.

``ours`` (the default) is the pure-Python parser layer of this package. ``vllm`` and ``sglang`` put
those engines' own parsers behind the same ``OutputParser`` interface, for deployments that want
exactly an engine's behaviour and for differential tests (tests/engine_env/*/test_*_parser_oracle.py).
They are optional extras (``pip install 'meshfront[vllm]'``): their modules are imported only by
``load_chat_processor`` when selected, so nothing of theirs is imported otherwise (an import costs 6-10 s
and pulls torch).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from collections.abc import Callable, Sequence
from typing import Protocol

from services.postprocessor.core.parsers.output import ParserConfig, build_output_parser
from services.postprocessor.core.parsers.types import ParsedDelta, new_call_id

DEFAULT_CHAT_PROCESSOR = "ours"

# name -> (the distribution's top-level module, the adapter module, the extra that installs it)
_ENGINE_BACKENDS = {
    "vllm": ("vllm", "services.postprocessor.core.parsers.backends.vllm", "vllm"),
    "sglang": ("sglang", "services.postprocessor.core.parsers.backends.sglang", "sglang"),
}
CHAT_PROCESSORS = (DEFAULT_CHAT_PROCESSOR, *_ENGINE_BACKENDS)


class ChatProcessorUnavailable(RuntimeError):
    """The selected chat processor's engine is not installed (or does not import)."""


@dataclasses.dataclass(frozen=True)
class ParseContext:
    """What an engine's parsers need beyond ``ParserConfig``.

    Attributes:
        model_dir: the model directory (its tokenizer gives the engines their marker token ids).
        tools_json: the request's ``tools`` as OpenAI JSON ("" for none).
        prompt_ids: the rendered prompt's last ids (engines tell from them whether reasoning is open).
    """

    model_dir: str = ""
    tools_json: str = ""
    prompt_ids: Sequence[int] = ()


class StreamingOutputParser(Protocol):
    """What the postprocessor drives for one sequence (``output.OutputParser`` is one)."""

    def feed(self, text: str, ids: Sequence[int] = ()) -> ParsedDelta:
        """New detokenized text and the generated ids it came from; returns what was settled."""

    def finish(self) -> ParsedDelta:
        """End of the stream: settles everything still held back."""

    @property
    def tool_calls(self) -> int: ...

    @property
    def ends_with_tool_calls(self) -> bool: ...


class ChatProcessor(Protocol):
    """Builds the output parser of one request."""

    name: str

    def output_parser(self, config: ParserConfig, context: ParseContext,
                      new_id: Callable[[], str] = new_call_id) -> StreamingOutputParser | None:
        """The request's parser, or None when its output is plain content."""


class OursChatProcessor:
    """The default: this package's parsers (of ``context`` they read only the tools' schemas)."""

    name = DEFAULT_CHAT_PROCESSOR

    def output_parser(self, config: ParserConfig, context: ParseContext,
                      new_id: Callable[[], str] = new_call_id) -> StreamingOutputParser | None:
        return build_output_parser(config, new_id, context.tools_json)


def load_chat_processor(name: str) -> ChatProcessor:
    """The chat processor called ``name``; meant to run once at startup.

    Raises:
        ValueError: ``name`` is not one of ``CHAT_PROCESSORS``.
        ChatProcessorUnavailable: its engine is not installed or fails to import.
    """
    if name == DEFAULT_CHAT_PROCESSOR:
        return OursChatProcessor()
    if name not in _ENGINE_BACKENDS:
        raise ValueError(f"unknown chat processor {name!r}; choose one of {', '.join(CHAT_PROCESSORS)}")
    package, module, extra = _ENGINE_BACKENDS[name]
    if importlib.util.find_spec(package) is None:
        raise ChatProcessorUnavailable(
            f"--chat-processor {name} needs {package}, which is not installed in this environment: "
            f"install the extra (pip install 'meshfront[{extra}]', see docs/parsers.md) or use "
            f"--chat-processor {DEFAULT_CHAT_PROCESSOR}")
    try:
        adapter = importlib.import_module(module)
    except ImportError as e:
        raise ChatProcessorUnavailable(
            f"--chat-processor {name}: {package} is installed but does not import: {e}") from e
    return adapter.CHAT_PROCESSOR_CLASS()
