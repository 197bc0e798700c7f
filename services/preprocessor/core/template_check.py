"""Compiles a deployment's own chat template (``--chat-template``) so that a broken one fails at start.

Kept light (jinja2 only) so that ``meshfront run`` can check the file before it starts anything. It
compiles in the environment templates render in (chat_jinja.py), so a template that compiles here
renders there.
"""

from __future__ import annotations

import jinja2

from services.preprocessor.core.chat_jinja import chat_environment


def check_template(source: str, origin: str) -> None:
    """Raises ValueError naming ``origin`` and the line when ``source`` does not compile."""
    try:
        chat_environment().parse(source)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"chat template {origin} does not compile: {e.message} (line {e.lineno})") from None


def read_chat_template(path: str) -> str:
    """The source of a ``--chat-template`` file, compiled once; "" for none.

    Raises:
        ValueError: the file is unreadable or empty, or the template does not compile.
    """
    if not path:
        return ""
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--chat-template {path}: cannot read it: {e}") from None
    if not source.strip():
        raise ValueError(f"--chat-template {path} is empty")
    check_template(source, f"--chat-template {path}")
    return source
