"""The owned chat template environment renders exactly what transformers' ``render_jinja_template`` renders.

Each template (the shipped one, and small ones that exercise each helper transformers' environment has)
is rendered over a corpus of conversations by both, and the text must be identical; where transformers
fails, ours fails with the same Jinja error type. The preprocessor no longer imports transformers (its
import is most of a preprocessor's start-up), so this is what keeps the two the same.
"""

from __future__ import annotations

import subprocess
import sys

import jinja2
import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from services.models import qwen
from services.preprocessor.core import chat_jinja
from tests.conftest import ROOT

pytestmark = pytest.mark.unit

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather <b>&amp;</b> ünïcode",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}

CONVERSATIONS = {
    "system-user": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi! 你好 😀 <tag>"}],
    "user-only": [{"role": "user", "content": "  spaced  \n"}],
    "tool-round-trip": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 21}'},
        {"role": "user", "content": "And now?"}],
    "reasoning-content": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "add them"},
        {"role": "user", "content": "3+3?"}],
    "reasoning-as-thinking": [
        {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4", "thinking": "add"},
        {"role": "user", "content": "again"}],
    "reasoning-as-reasoning": [
        {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4", "reasoning": "add"},
        {"role": "user", "content": "again"}],
    "content-parts": [{"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image"}]}],
    "empty": [],
}

# Small templates, one per helper or option of transformers' environment.
HELPERS = {
    "tojson": "{% for m in messages %}{{ m | tojson }}|{{ m | tojson(indent=2, sort_keys=true) }}"
              "|{{ m | tojson(separators=(',', ':'), ensure_ascii=true) }}{% endfor %}{{ tools | tojson }}",
    "namespace": "{% set ns = namespace(n=0, last='') %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
                 "{% set ns.last = m.role %}{% endfor %}{{ ns.n }} {{ ns.last }}",
    "dict": "{% set d = dict(a=1, b=messages | length) %}{{ d | tojson }}{{ dict.fromkeys(['x', 'y'], 0) | tojson }}",
    "loopcontrols": "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
                    "{% if m.role == 'system' %}{% continue %}{% endif %}[{{ m.role }}]{% endfor %}",
    "trim-and-lstrip": "{% for m in messages %}\n    {% if m.content is string %}\n  {{ m.content }}\n"
                       "    {% endif %}\n{% endfor %}\n{% if add_generation_prompt %}\n<gen>\n{% endif %}",
    "generation-tag": "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}"
                      "{% set inner = 'x' %}A:{{ m.content }}{% endgeneration %}{% else %}{{ m.role }}{% endif %}"
                      "{% endfor %}{{ inner is defined }}",
    "reasoning-names": "{% for m in messages %}{{ m.reasoning_content }}/{{ m.thinking }}/{{ m.reasoning }};"
                       "{% endfor %}",
    "special-tokens": "{{ bos_token }}{{ eos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ flavour }}",
    "strftime": "{{ strftime_now('%Y') }}",
    "raise": "{% if messages | length == 0 %}{{ raise_exception('no messages') }}{% endif %}ok",
    "undefined-attribute": "{{ messages[0].nope.deeper }}",
    "sandbox-escape": "{{ messages.__class__.__mro__ }}",
    "namespace-dunder": "{% set ns = namespace(_secret=1) %}{{ ns._secret }}",
    "dict-escape": "{{ dict.__call__.__globals__ }}",
}

TEMPLATES = {"qwen-hermes": qwen.chat_template(), **HELPERS}
CONTEXT = {"bos_token": "<s>", "eos_token": "</s>", "flavour": "mint", "enable_thinking": False}


def theirs(template: str, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool) -> str:
    rendered, _ = render_jinja_template(conversations=[messages], tools=tools, chat_template=template,
                                        add_generation_prompt=add_generation_prompt, **CONTEXT)
    return rendered[0]


def outcome(render, *args) -> tuple[str, str]:
    """("ok", text) or ("error", the exception's type name)."""
    try:
        return "ok", render(*args)
    except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
        return "error", type(e).__name__


@pytest.mark.parametrize("template_name", sorted(TEMPLATES))
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("with_tools", [False, True])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_renders_what_transformers_renders(template_name, conversation, with_tools, add_generation_prompt):
    template, messages = TEMPLATES[template_name], CONVERSATIONS[conversation]
    tools = [WEATHER] if with_tools else None
    ours = outcome(chat_jinja.render, template, [dict(m) for m in messages], tools, add_generation_prompt,
                   dict(CONTEXT))
    expected = outcome(theirs, template, [dict(m) for m in messages], tools, add_generation_prompt)
    assert ours == expected


def test_the_corpus_reaches_every_helper():
    """The comparison above would pass vacuously if the helpers' templates all failed on both sides."""
    def rendered(name, conversation="reasoning-content"):
        return chat_jinja.render(TEMPLATES[name], CONVERSATIONS[conversation], [WEATHER], True, dict(CONTEXT))

    assert rendered("namespace") == "3 user"
    assert rendered("loopcontrols", "system-user") == "[user]"
    assert rendered("generation-tag") == "userA:4userFalse"
    assert rendered("reasoning-names", "reasoning-as-reasoning") == "//;add/add/add;//;"
    assert '"description": "Current weather <b>&amp;</b> ünïcode"' in rendered("tojson")
    assert rendered("trim-and-lstrip", "user-only") == "    spaced  \n\n<gen>\n"  # lstrip only before tags
    with pytest.raises(jinja2.TemplateError, match="no messages"):
        rendered("raise", "empty")
    with pytest.raises(jinja2.exceptions.SecurityError):
        rendered("namespace-dunder")


def test_the_caller_messages_are_not_changed():
    messages = [dict(m) for m in CONVERSATIONS["reasoning-as-thinking"]]
    chat_jinja.render(TEMPLATES["qwen-hermes"], messages, None, True, dict(CONTEXT))
    assert messages == CONVERSATIONS["reasoning-as-thinking"]


def test_the_preprocessor_starts_without_importing_transformers():
    code = "import sys, services.preprocessor.main; print('transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
