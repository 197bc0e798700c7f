"""A request's thinking budget (``nvext.max_thinking_tokens``, Anthropic's ``thinking.budget_tokens``): enforced
or refused, never dropped.

A worker can enforce it when its reasoning parser (``--reasoning-parser``) delimits thinking with two markers
that are single tokens of the model's vocabulary (``services.common.parser_names.THINKING_BLOCKS``): once the
thinking block holds the budget's number of tokens, the next token is forced to be the closing marker, and
the answer follows as usual. The block counts from where it opens: in the prompt (the template opened it,
e.g. Qwen3 with thinking on, DeepSeek R1, MiniMax M2: the prompt's last opening marker comes after its last
closing one) or in the output, when the model writes the opening marker itself. A budget of 0 closes the
block at once. Where it cannot be enforced (no reasoning parser, one that ends thinking at a header of
several tokens, markers that are not one token each), the request is refused with a 400 naming the field.

vLLM enforces it itself, per batch (``SamplingParams.thinking_token_budget`` with a ``ReasoningConfig``
built from the same markers: services/workers/vllm/thinking_budget.py); the hf worker, which already picks
each token in Python, uses ``ThinkingBudget`` below.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from services.common.parser_names import THINKING_BLOCKS
from services.workers.engine import EngineRequest, RequestRejected

PARAM = "nvext.max_thinking_tokens"


@dataclasses.dataclass(frozen=True, slots=True)
class ThinkingMarkers:
    """The thinking block's markers as token ids; ``why_not`` says why there are none (then ids are -1)."""

    start: int = -1
    end: int = -1
    start_text: str = ""
    end_text: str = ""
    why_not: str = ""

    @property
    def enforceable(self) -> bool:
        return not self.why_not


def thinking_markers(reasoning_parser: str, tokenizer: Any | None) -> ThinkingMarkers:
    """The markers of ``reasoning_parser`` in ``tokenizer`` (a ``tokenizers.Tokenizer``), or why not."""
    if not reasoning_parser:
        return ThinkingMarkers(why_not="the worker registers no reasoning parser, so it cannot tell thinking "
                                       "from the answer")
    block = THINKING_BLOCKS.get(reasoning_parser)
    if block is None:
        return ThinkingMarkers(why_not=f"the model's reasoning format ({reasoning_parser}) does not end thinking "
                                       "at one token")
    if tokenizer is None:
        return ThinkingMarkers(why_not="the model directory has no tokenizer.json")
    ids = [tokenizer.token_to_id(marker) for marker in block]
    if None in ids:
        missing = block[ids.index(None)]
        return ThinkingMarkers(why_not=f"{missing!r} is not one token of the model's vocabulary")
    return ThinkingMarkers(ids[0], ids[1], *block)


def check(request: EngineRequest, engine: str, markers: ThinkingMarkers) -> int | None:
    """The request's budget if ``markers`` can enforce it (None without one); a budget that cannot be
    enforced is a 400 naming the field, never silently unbounded thinking."""
    budget = request.max_thinking_tokens
    if budget is not None and not markers.enforceable:
        raise RequestRejected(f"the {engine} worker cannot enforce a thinking budget ('{PARAM}' or "
                              f"'thinking.budget_tokens'): {markers.why_not}; send the request without one",
                              param=PARAM)
    return budget


class ThinkingBudget:
    """One sequence's thinking block, for a decode loop that picks each token itself (the hf worker).

    ``forced()`` before each step: the token the step must produce, or None; ``observe(token)`` after it.
    Two integer comparisons a token, on a path that already runs Python per token.
    """

    def __init__(self, markers: ThinkingMarkers, budget: int, prompt: Sequence[int]):
        self._start, self._end = markers.start, markers.end
        self._left = budget
        opened = _last(prompt, self._start)
        self._thinking = opened > _last(prompt, self._end)
        if self._thinking:  # tokens the prompt already put in the block count too
            self._left -= len(prompt) - opened - 1

    def forced(self) -> int | None:
        return self._end if self._thinking and self._left <= 0 else None

    def observe(self, token: int) -> None:
        if not self._thinking:
            self._thinking = token == self._start
        elif token == self._end:
            self._thinking = False
        else:
            self._left -= 1


def _last(ids: Sequence[int], token: int) -> int:
    for i in range(len(ids) - 1, -1, -1):
        if ids[i] == token:
            return i
    return -1
