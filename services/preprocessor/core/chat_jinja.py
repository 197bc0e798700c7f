"""The Jinja environment chat templates run in: transformers' ``apply_chat_template`` environment, owned here.

transformers renders with a sandboxed environment of fixed options and a handful of helpers. Importing
transformers to reach it costs a preprocessor about 0.9 s of its 1.4 s start-up (its package import scans
every model module), and a restarted or scaled-out preprocessor serves only after it. So the environment
lives here, in plain jinja2, and tests/unit/preprocessor/test_chat_jinja.py renders every shipped
template over a corpus of conversations with both and requires identical text.

What transformers' environment has, and so this one: ``trim_blocks``, ``lstrip_blocks``,
``loopcontrols``, the ``{% generation %}`` tag (training templates mark assistant spans with it; here
it renders its body, as transformers does outside training), a ``tojson`` that neither escapes HTML nor
ASCII-fies, ``raise_exception``, ``strftime_now``, and a ``dict`` and ``namespace`` that refuse dunder
and underscore tricks. The environment is immutable and sandboxed: templates come from model
directories, which are code we did not write.
"""

from __future__ import annotations

import datetime
import functools
import json
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.runtime
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Earlier Jinja releases have known sandbox escapes (transformers refuses them for the same reason).
if tuple(int(p) for p in jinja2.__version__.split(".")[:3]) < (3, 1, 6):
    raise ImportError(f"chat templates need jinja2>=3.1.6 (a sandbox fix); this is {jinja2.__version__}")

# Names a message's reasoning may arrive under; templates read the first (Qwen, DeepSeek) or "thinking" (gpt-oss).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: renders its body (it marks trainable spans in training)."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        # A call block, as transformers parses it, so the body's scope (what a set inside it reaches) is the same.
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _body(caller: jinja2.runtime.Macro) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.datetime.now().strftime(format)


class _TemplateDict:
    """``dict(...)`` and ``dict.fromkeys(...)`` only: the type itself would hand the template its attributes."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """Jinja's ``namespace`` without underscore-named attributes (a way towards CPython internals)."""

    # No named self: Jinja's own trick, so that namespace(self=...) still works.
    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}")


def chat_environment() -> ImmutableSandboxedEnvironment:
    """A fresh environment with transformers' options and helpers (one per compiled template, as there)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


@functools.lru_cache(maxsize=64)
def compile_chat_template(source: str) -> jinja2.Template:
    """``source`` compiled once per process (a model's template, or a deployment's --chat-template).

    Raises:
        jinja2.TemplateSyntaxError: the template does not compile.
    """
    return chat_environment().from_string(source)


def with_reasoning_aliases(messages: list[dict]) -> list[dict]:
    """Each message's reasoning under every name templates read it by, as transformers passes it: a
    message with any of them gets ``thinking`` (unless it has its own) and ``reasoning_content``."""
    aliased = []
    for message in messages:
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        aliased.append(message)
    return aliased


def render(source: str, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool,
           context: dict[str, Any]) -> str:
    """One conversation rendered as ``render_jinja_template`` renders it (no documents, no continuation).

    ``messages``, ``tools`` and ``context`` are plain JSON data (what a request parses into), so nothing
    needs transformers' conversion of rich objects into template-safe ones.
    """
    return compile_chat_template(source).render(messages=with_reasoning_aliases(messages), tools=tools,
                                                documents=None, add_generation_prompt=add_generation_prompt,
                                                **context)
