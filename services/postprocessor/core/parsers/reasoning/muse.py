"""Muse Glimmer reasoning: the ``to=self`` channel (names: muse, muse_glimmer).

The channel grammar is ``core/parsers/muse_channels.py``: ``self`` bodies are reasoning, ``user`` bodies
and unframed text content, the framing is dropped. A request that offered tools is read by the
tool-call parser (``tool_calls/muse.py``), which splits the same channels and reads the calls: one
parser for both, as Dynamo's unified parser is (``output.py`` builds only that one). This parser runs
when no tools were offered (or ``tool_choice`` is not ``auto``): a tool channel's text is then dropped,
as Dynamo drops it.
"""

from __future__ import annotations

from services.postprocessor.core.parsers.muse_channels import ENDS, MESSAGE, MuseChannels


class MuseReasoningParser(MuseChannels):
    # A reasoning body ends at either terminator or at the next header: no single token closes it, so a
    # thinking budget cannot be enforced (services/common/parser_names.py THINKING_BLOCKS).
    open_tags = ("to=self" + MESSAGE,)
    close_tags = ENDS

    def __init__(self, prompt_opens_reasoning: bool = False, thinking: bool = True):
        super().__init__(prompt_opens_reasoning=prompt_opens_reasoning, thinking=thinking)
