"""Meshfront's request and SGLang's outputs, mapped both ways (pure: no sglang import, so it unit-tests anywhere).

``request_kwargs`` gives the keyword arguments of ``sglang.Engine.async_generate`` (the same names
as ``GenerateReqInput``) for one ``EngineRequest``; ``sampling_params`` in it is the dict SGLang
turns into its ``SamplingParams``. Every field of the request is either mapped or refused here;
nothing is dropped:

- sampling knobs the client left unset take the model's defaults, as SGLang's own server does
  (``ModelConfig.get_default_sampling_params``: generation_config.json's temperature, top_p,
  top_k, min_p and repetition_penalty unless ``--sampling-defaults openai``);
- ``max_tokens`` always goes out as ``max_new_tokens``: SGLang's own default is 128, not "up to
  the context window";
- ``seed`` is SGLang's ``sampling_seed``, which its sampler reads only under
  ``--enable-deterministic-inference``: without it a seeded request is refused, not silently
  sampled at random;
- EOS and hidden stop ids become ``stop_token_ids``. SGLang's ``ignore_eos`` switches off every
  token stop, so ``ignore_eos`` with stop ids is refused;
- ``logprobs`` is request-level in SGLang (``return_logprob``/``top_logprobs_num``), not a
  sampling parameter;
- guided decoding becomes ``json_schema`` / ``regex`` / ``ebnf`` (a choice is a regex alternation,
  json_object the permissive ``{"type": "object"}`` schema SGLang's own server uses);
- a thinking budget names SGLang's thinking-budget logit processor (``custom_logit_processor``) with
  ``custom_params={"thinking_budget": N}`` where the engine has one for the model (thinking_budget.py),
  and is refused with a 400 saying why elsewhere.

Outputs: SGLang streams *cumulative* ``output_ids`` (and logprob lists) in its default mode; the
engine keeps how many it has sent and ``new_tokens`` cuts off the rest. The ids are untrimmed:
an EOS or stop id that ended the sequence is the last id, as the worker contract wants.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from services.workers.engine import (
    EngineBusy,
    EngineError,
    EngineRequest,
    FinishReason,
    GuidedDecoding,
    RequestRejected,
    TokenLogprob,
)
from services.workers.thinking_budget import ThinkingMarkers, check, thinking_markers

# The knobs ModelConfig.get_default_sampling_params may default (SGLang's own list).
DEFAULTABLE = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
# Request knobs that keep their name in SGLang's SamplingParams (a test pins them to SGLang's fields).
KNOBS = (*DEFAULTABLE, "frequency_penalty", "presence_penalty")


@dataclasses.dataclass(frozen=True)
class EngineLimits:
    """What the running engine allows, read once after it started."""

    max_model_len: int  # the context window less the tokens SGLang reserves per request
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # --enable-deterministic-inference: the only mode in which SGLang samples with a request's seed.
    seeded: bool = False
    # False under --skip-tokenizer-init: SGLang then has no grammar backend and no EOS for min tokens.
    has_tokenizer: bool = True
    # The model's thinking markers, or why a budget cannot be enforced (by default: no reasoning parser), and
    # SGLang's thinking-budget processor serialised for this model (thinking_budget.py): "" exactly when not.
    thinking: ThinkingMarkers = thinking_markers("", None)
    thinking_processor: str = ""

    def __post_init__(self) -> None:
        if self.thinking.enforceable != bool(self.thinking_processor):
            raise ValueError("a thinking budget is enforceable exactly when there is a processor to enforce it")


def request_kwargs(request: EngineRequest, rid: str, limits: EngineLimits) -> dict[str, Any]:
    """``sglang.Engine.async_generate(**result)`` (equally ``GenerateReqInput(**result)``)."""
    prompt_len = len(request.token_ids)
    if prompt_len == 0:
        raise RequestRejected("the prompt is empty")
    room = limits.max_model_len - prompt_len
    if room <= 0:
        raise RequestRejected(f"the prompt has {prompt_len} tokens; the context window is {limits.max_model_len}")
    kwargs: dict[str, Any] = {
        "input_ids": list(request.token_ids),
        "sampling_params": sampling_params(request, room, limits),
        "rid": rid,
        "stream": True,
    }
    if request.max_thinking_tokens is not None:  # sampling_params has checked that it is enforceable
        kwargs["custom_logit_processor"] = limits.thinking_processor
    if request.logprobs is not None:
        if request.logprobs < 0:
            raise RequestRejected("logprobs must be at least 0")
        # Only the output's logprobs (logprob_start_len -1, SGLang's default): no prompt scoring.
        kwargs.update(return_logprob=True, top_logprobs_num=request.logprobs)
    return kwargs


def sampling_params(request: EngineRequest, room: int, limits: EngineLimits) -> dict[str, Any]:
    """The ``sampling_params`` dict: ``sglang.srt.sampling.sampling_params.SamplingParams(**result)``."""
    if request.max_tokens is not None and request.max_tokens <= 0:
        raise RequestRejected("max_tokens must be at least 1")
    thinking_budget = check(request, "SGLang", limits.thinking)
    if request.ignore_eos and request.stop_token_ids:
        raise RequestRejected("SGLang's ignore_eos also ignores stop_token_ids: use one or the other")
    if not limits.has_tokenizer:
        if request.min_tokens > 0:
            raise RequestRejected("min_tokens needs the SGLang worker without --skip-tokenizer-init")
        if request.guided is not None:
            raise RequestRejected("guided decoding needs the SGLang worker without --skip-tokenizer-init")
    s = request.sampling
    params: dict[str, Any] = {name: limits.defaults[name] for name in DEFAULTABLE if name in limits.defaults}
    for name in KNOBS:
        value = getattr(s, name)  # every name is a field of both SamplingParams (a test pins the list)
        if value is not None:
            params[name] = value
    if s.seed is not None:
        if not limits.seeded:
            raise RequestRejected("seed: SGLang samples with a seed only when the worker runs with "
                                  "--enable-deterministic-inference")
        params["sampling_seed"] = s.seed
    stop_ids = list(dict.fromkeys((*request.eos_token_ids, *request.stop_token_ids)))
    params.update(
        n=1,  # the gateway fans n choices out into n requests
        max_new_tokens=min(request.max_tokens or room, room),
        min_new_tokens=request.min_tokens,
        ignore_eos=request.ignore_eos,
        stop_token_ids=stop_ids or None,
    )
    if request.guided is not None:
        params.update(guided_params(request.guided))
    if thinking_budget is not None:
        params["custom_params"] = {"thinking_budget": thinking_budget}
    return params


def guided_params(guided: GuidedDecoding) -> dict[str, str]:
    """The one grammar field of SGLang's SamplingParams that carries the constraint."""
    schema = guided.as_json_schema()  # json_object: {"type": "object"}, as SGLang's server sends it
    if schema is not None:
        return {"json_schema": schema}
    if guided.regex:
        return {"regex": guided.regex}
    if guided.choice:
        return {"regex": choice_regex(guided.choice)}
    if guided.grammar:
        return {"ebnf": guided.grammar}
    if guided.structural_tag:  # SamplingParams.structural_tag: xgrammar's JSON, as for vLLM
        return {"structural_tag": guided.structural_tag}
    raise RequestRejected("guided decoding without a constraint")


# Characters with a meaning in the regex dialects of SGLang's grammar backends. re.escape would
# also escape spaces, '#', '&', '~' and newlines, escapes xgrammar does not know (it warns).
_REGEX_META = frozenset("\\^$.|?*+()[]{}")


def choice_regex(choices: Sequence[str]) -> str:
    """Exactly one of ``choices``, each matched literally (SGLang has no choice constraint of its own)."""
    return "(" + "|".join(_literal(choice) for choice in choices) + ")"


def _literal(text: str) -> str:
    return "".join("\\" + c if c in _REGEX_META else c for c in text)


def finish_reason(reason: Mapping[str, Any] | None, eos_token_ids: Sequence[int],  # noqa: PLR0911 - a table
                  stop_token_ids: Sequence[int]) -> FinishReason:
    """SGLang's ``meta_info["finish_reason"]`` as the mocker reports it.

    ``{"type": "stop", "matched": id}`` names the id that ended the sequence: one of our stop ids
    is STOP; an EOS id, or SGLang's own end of a grammar (the last id, not a stop id), is EOS.
    A ``matched`` string can only be a stop string or regex, which we never send: STOP.
    """
    if reason is None:
        return FinishReason.NONE
    kind = reason["type"]
    if kind == "length":
        return FinishReason.LENGTH
    if kind == "stop":
        matched = reason["matched"]
        if isinstance(matched, int) and not isinstance(matched, bool):
            if matched in stop_token_ids and matched not in eos_token_ids:
                return FinishReason.STOP
            return FinishReason.EOS
        return FinishReason.STOP
    if kind == "abort":
        return FinishReason.CANCELLED
    return FinishReason.ERROR


def abort_error(reason: Mapping[str, Any] | None) -> EngineError | None:
    """The error behind an abort SGLang decided itself (a status code set), None for a plain abort.

    4xx: the request cannot be served (a grammar that does not compile, a prompt too long for the
    scheduler); 503: SGLang shed it (its queue is full, a higher priority request took its
    place), so another worker may take it; anything else is an engine failure.
    """
    if reason is None or reason["type"] != "abort":
        return None
    status = reason.get("status_code")  # absent on the echo of a plain abort
    message = str(reason.get("message", "aborted"))
    if status is None:
        return None
    status = int(status)
    if 400 <= status < 500:
        return RequestRejected(message)
    if status == 503:
        return EngineBusy(message)
    return EngineError(f"SGLang aborted the request ({status}): {message}")


@dataclasses.dataclass(frozen=True, slots=True)
class NewTokens:
    """What one SGLang output adds to what was sent before."""

    token_ids: list[int]
    token_logprobs: list[Any] | None  # SGLang's (logprob, token_id, text) per new id
    top_logprobs: list[Any] | None  # per new id: a list of (logprob, token_id, text), or None


def new_tokens(out: Mapping[str, Any], sent: int, top: int | None) -> NewTokens:
    """The ids (and their logprobs) of a cumulative SGLang output past the first ``sent``.

    SGLang hands out its own growing lists (not copies) between outputs, so they are sliced here,
    at once. ``top``: the request's logprobs (None: it asked for none). SGLang fills
    ``output_top_logprobs`` only when it was asked for at least one alternative.
    """
    ids = list(out["output_ids"][sent:])
    if top is None:
        return NewTokens(ids, None, None)
    meta = out["meta_info"]
    token_lps = list(meta["output_token_logprobs"][sent:])
    top_lps = list(meta["output_top_logprobs"][sent:]) if top > 0 else [None] * len(token_lps)
    return NewTokens(ids, token_lps, top_lps)


def token_logprobs(new: NewTokens, top: int) -> list[TokenLogprob]:
    """SGLang's per-id ``(logprob, token_id, text)`` entries as ``TokenLogprob``s.

    ``top_logprobs_num`` alternatives come best first; the sampled id's own logprob is its entry
    in ``output_token_logprobs`` whatever its rank.
    """
    if new.token_logprobs is None or new.top_logprobs is None:
        raise ValueError("the request asked for no logprobs")
    out = []
    for token_id, entry, alternatives in zip(new.token_ids, new.token_logprobs, new.top_logprobs, strict=True):
        logprob, entry_id = entry[0], entry[1]
        if entry_id != token_id:
            raise ValueError(f"SGLang's logprob entry is for token {entry_id}, the output has {token_id}")
        ranked = () if top == 0 or alternatives is None else \
            tuple((int(alt[1]), float(alt[0])) for alt in alternatives[:top])
        out.append(TokenLogprob(token_id=token_id, logprob=float(logprob), top=ranked))
    return out
