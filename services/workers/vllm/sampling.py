"""Meshfront's request and vLLM's outputs, mapped both ways (pure: no vllm import, so it unit-tests anywhere).

``sampling_kwargs`` gives the keyword arguments of ``vllm.SamplingParams`` for one
``EngineRequest``; the engine module builds the object. Every field of the request is either
mapped or refused here; nothing is dropped:

- sampling knobs the client left unset take the model's defaults, as vLLM's own server does
  (``ModelConfig.get_diff_sampling_param``: generation_config.json unless ``--generation-config vllm``);
- tokens in, tokens out: ``detokenize=False`` (the postprocessor renders text), DELTA outputs;
- stop strings never reach a worker (the postprocessor matches them on text); EOS and hidden stop
  ids become ``stop_token_ids`` so the engine stops at exactly the ids the preprocessor chose;
- ``logprobs`` is the number of alternatives per token, vLLM's ``logprobs`` (0: the sampled
  token's only);
- guided decoding becomes ``StructuredOutputsParams`` keyword arguments;
- a thinking budget becomes ``thinking_token_budget`` where the engine enforces it
  (``services/workers/vllm/thinking_budget.py``), and is refused with a 400 naming it elsewhere;
- a leg of a disaggregated request carries its KV connector parameters in ``extra_args``
  (``services/workers/vllm/transfer.py``); a prefill leg makes one token.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from services.workers.engine import (
    EngineRequest,
    FinishReason,
    GuidedDecoding,
    RequestRejected,
    TokenLogprob,
)
from services.workers.thinking_budget import ThinkingMarkers, check
from services.workers.vllm import transfer

# The knobs get_diff_sampling_param may default (max_tokens is sized per request below).
_DEFAULTABLE = ("temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
                "repetition_penalty")


# Why a started vLLM engine without a reasoning config cannot enforce a thinking budget.
_NO_REASONING_CONFIG = ThinkingMarkers(why_not="the model's reasoning parser names no end-of-thinking marker "
                                               "that is one token (--reasoning-parser)")


def sampling_kwargs(request: EngineRequest, *, max_model_len: int, defaults: Mapping[str, Any],
                    thinking_budgets: bool = False) -> dict[str, Any]:
    """``vllm.SamplingParams(**result)`` for ``request``; the structured outputs are a nested dict.
    ``thinking_budgets``: the engine enforces ``thinking_token_budget`` (thinking_budget.enforces)."""
    prompt_len = len(request.token_ids)
    if prompt_len == 0:
        raise RequestRejected("the prompt is empty")
    room = max_model_len - prompt_len
    if room <= 0:
        raise RequestRejected(f"the prompt has {prompt_len} tokens; the context window is {max_model_len}")
    if request.max_tokens is not None and request.max_tokens <= 0:
        raise RequestRejected("max_tokens must be at least 1")
    thinking_budget = request.max_thinking_tokens if thinking_budgets else check(request, "vLLM", _NO_REASONING_CONFIG)
    default_max = defaults.get("max_tokens")
    max_tokens = request.max_tokens if request.max_tokens is not None else default_max or room
    min_tokens = request.min_tokens
    if transfer.leg(request.kv_transfer_params) is transfer.Leg.PREFILL:
        # The prefill leg's one token; the decode leg owes the rest, min_tokens included.
        max_tokens, min_tokens = 1, min(min_tokens, 1)
    s = request.sampling
    kwargs: dict[str, Any] = {name: defaults[name] for name in _DEFAULTABLE if name in defaults}
    for name in _DEFAULTABLE:
        value = getattr(s, name)  # every name is a SamplingParams field (a test pins the list)
        if value is not None:
            kwargs[name] = value
    kwargs.update(
        n=1,  # the gateway fans n choices out into n requests
        seed=s.seed,
        max_tokens=min(max_tokens, room),
        min_tokens=min_tokens,
        ignore_eos=request.ignore_eos,
        stop_token_ids=list(dict.fromkeys((*request.eos_token_ids, *request.stop_token_ids))),
        logprobs=request.logprobs,
        detokenize=False,
        skip_special_tokens=False,  # nothing is rendered; the postprocessor decides what is shown
    )
    if thinking_budget is not None:
        kwargs["thinking_token_budget"] = thinking_budget
    if request.guided is not None:
        kwargs["structured_outputs"] = structured_outputs_kwargs(request.guided)
    extra = transfer.extra_args(request.kv_transfer_params)
    if extra is not None:
        kwargs["extra_args"] = extra
    return kwargs


def structured_outputs_kwargs(guided: GuidedDecoding) -> dict[str, Any]:
    """``vllm.sampling_params.StructuredOutputsParams(**result)``."""
    if guided.json_schema:
        return {"json": guided.json_schema}
    if guided.json_object:
        return {"json_object": True}
    if guided.regex:
        return {"regex": guided.regex}
    if guided.choice:
        return {"choice": list(guided.choice)}
    if guided.grammar:
        return {"grammar": guided.grammar}
    if guided.structural_tag:  # xgrammar's JSON, as vLLM's structured outputs take it
        return {"structural_tag": guided.structural_tag}
    raise RequestRejected("guided decoding without a constraint")


def finish_reason(vllm_reason: str | None, stop_reason: int | str | None,
                  eos_token_ids: Sequence[int]) -> FinishReason:
    """vLLM's ``CompletionOutput.finish_reason``/``stop_reason`` as the mocker reports them."""
    if vllm_reason is None:
        return FinishReason.NONE
    if vllm_reason == "length":
        return FinishReason.LENGTH
    if vllm_reason == "stop":
        # stop_reason None: the model's own EOS; an int: one of our stop_token_ids.
        if stop_reason is None or stop_reason in eos_token_ids:
            return FinishReason.EOS
        return FinishReason.STOP
    if vllm_reason == "abort":
        return FinishReason.CANCELLED
    return FinishReason.ERROR


def token_logprobs(token_ids: Sequence[int], positions: Sequence[Mapping[int, Any] | None],
                   top: int) -> list[TokenLogprob]:
    """vLLM's per-position ``{token_id: Logprob}`` dicts as ``TokenLogprob``s.

    vLLM returns the ``top`` best alternatives plus the sampled token (whose rank may be worse);
    alternatives are ordered by rank, the sampled token's own logprob is always its entry.
    """
    out = []
    for token_id, position in zip(token_ids, positions, strict=True):
        if position is None:
            raise ValueError(f"vLLM returned no logprobs for token {token_id}")
        ranked = sorted(position.items(), key=lambda item: item[1].rank)
        out.append(TokenLogprob(token_id=token_id, logprob=float(position[token_id].logprob),
                                top=tuple((tid, float(lp.logprob)) for tid, lp in ranked[:top])))
    return out
