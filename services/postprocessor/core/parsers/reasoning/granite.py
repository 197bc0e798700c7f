"""IBM Granite 3.x reasoning: plain-text section headers instead of tags::

    Here is my thought process: … Here is my response: …

(``Here's`` instead of ``Here is`` occurs too.) The output is reasoning only when it opens with the
first header (leading whitespace allowed); otherwise, as when thinking is off, it is all content.
"""

from __future__ import annotations

from services.postprocessor.core.parsers.reasoning.think_tags import ThinkTagParser


class GraniteReasoningParser(ThinkTagParser):
    """``Here is my thought process:`` … ``Here is my response:``; reasoning only when opened (granite)."""

    open_tags = ("Here is my thought process:", "Here's my thought process:")
    close_tags = ("Here is my response:", "Here's my response:")
