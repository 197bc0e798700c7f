"""Next-token selection for the hf worker: penalties, temperature, top-k, top-p, min-p, logprobs.

Pure torch on one position's logits (a 1-D float tensor over the vocabulary). Follows vLLM's
semantics: temperature 0 (or unset with the default of 1.0 replaced by the caller) is greedy;
top-k <= 0 and top-p >= 1 disable those filters; returned logprobs are the model's raw
log-softmax, before any penalty or filter (vLLM's default ``raw_logprobs``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from services.workers.engine import SamplingParams, TokenLogprob

_GREEDY_BELOW = 1e-5


class TokenHistory:
    """Counts of the tokens seen so far, for the OpenAI and repetition penalties."""

    def __init__(self, vocab_size: int, prompt: Sequence[int]):
        self.output_counts = torch.zeros(vocab_size, dtype=torch.float32)
        self.seen = torch.zeros(vocab_size, dtype=torch.bool)
        self.seen[torch.tensor(list(prompt), dtype=torch.long)] = True

    def add(self, token_id: int) -> None:
        self.output_counts[token_id] += 1
        self.seen[token_id] = True


def apply_penalties(logits: torch.Tensor, params: SamplingParams, history: TokenHistory) -> torch.Tensor:
    """Frequency and presence penalties count output tokens; repetition counts prompt tokens too."""
    if params.repetition_penalty and params.repetition_penalty != 1.0:
        rp = params.repetition_penalty
        penalised = torch.where(logits > 0, logits / rp, logits * rp)
        logits = torch.where(history.seen, penalised, logits)
    if params.frequency_penalty:
        logits = logits - params.frequency_penalty * history.output_counts
    if params.presence_penalty:
        logits = logits - params.presence_penalty * (history.output_counts > 0).float()
    return logits


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Masks (to -inf) what top-k, top-p and min-p exclude; at least one token always survives."""
    if params.top_k is not None and 0 < params.top_k < logits.numel():
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p is not None and params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the mass before it already reaches top_p (the first never is).
        drop_sorted = (torch.cumsum(probs, dim=-1) - probs) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    if params.min_p:
        probs = torch.softmax(logits, dim=-1)
        logits = logits.masked_fill(probs < params.min_p * probs.max(), float("-inf"))
    return logits


def pick_token(logits: torch.Tensor, params: SamplingParams, *, generator: torch.Generator | None = None,
               banned: Sequence[int] = (), history: TokenHistory | None = None,
               top_logprobs: int | None = None, forced: int | None = None) -> tuple[int, TokenLogprob | None]:
    """Chooses the next token from ``logits``; ``banned`` ids (EOS before min_tokens) are never chosen, and
    ``forced`` (a spent thinking budget's closing marker) is chosen whatever the logits say. Logprobs stay
    the model's own."""
    raw = logits.float()
    if forced is not None:
        return forced, (logprob_of(raw, forced, top_logprobs) if top_logprobs is not None else None)
    x = raw
    if history is not None:
        x = apply_penalties(x, params, history)
    banned = [t for t in banned if t < x.numel()]
    if banned:
        x = x.clone()
        x[torch.tensor(banned, dtype=torch.long)] = float("-inf")
    temperature = 1.0 if params.temperature is None else params.temperature
    if temperature < _GREEDY_BELOW:
        token = int(torch.argmax(x))
    else:
        x = filter_logits(x / temperature, params)
        probs = torch.softmax(x, dim=-1)
        token = int(torch.multinomial(probs, 1, generator=generator))
    return token, (logprob_of(raw, token, top_logprobs) if top_logprobs is not None else None)


def logprob_of(logits: torch.Tensor, token: int, top: int) -> TokenLogprob:
    logprobs = torch.log_softmax(logits, dim=-1)
    best = torch.topk(logprobs, top) if top > 0 else None
    alternatives = () if best is None else tuple(zip(best.indices.tolist(), best.values.tolist(), strict=True))
    return TokenLogprob(token, float(logprobs[token]), alternatives)
