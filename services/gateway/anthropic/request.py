"""Parses and validates Anthropic Messages bodies into the chat request the OpenAI path runs.

``POST /v1/messages`` and ``/v1/messages/count_tokens`` both become an OpenAI ``ChatRequest``
(services/gateway/core/openai_request.py), so templating, tool-call guidance, stop strings and parsing
are the mesh's one chat path. Every field is read or refused: unknown ones are a 400 naming them.

``thinking`` maps onto the chat template's ``enable_thinking`` switch, which the reasoning parser
follows: ``enabled`` (or ``adaptive``) turns it on, ``disabled`` off; absent leaves the model's
default (the parser still splits any reasoning the model emits into ``thinking`` blocks).
``budget_tokens`` is checked as Anthropic checks it (>= 1024 and below ``max_tokens``) and travels
to the worker as the thinking budget (``max_thinking_tokens``), which the worker enforces or refuses
with a 400 (services/workers/thinking_budget.py). ``output_config``
is structured output (``format``) and ``effort``; ``cache_control`` markers are accepted (the
workers' prefix cache reuses shared prefixes without them).
"""

from __future__ import annotations

from typing import Any

from services.common.errors import InvalidRequest
from services.gateway.anthropic import content
from services.gateway.core import tools as tools_checks
from services.gateway.core.fields import INT32, UINT32, Fields
from services.gateway.core.pins import read_pins
from services.gateway.core.request import ChatRequest, Sampling, load_json

MAX_STOP_SEQUENCES = 32  # the preprocessor's limit on stop strings
# Claude Code opens its system prompt with this line (cc_version=...; cch=<per-session hash>;).
BILLING_HEADER = "x-anthropic-billing-header:"
MIN_THINKING_BUDGET = 1024
_SERVICE_TIERS = ("auto", "standard_only")


def _stop_sequences(f: Fields) -> list[str]:
    stops = f.list("stop_sequences") or []
    if not all(isinstance(s, str) and s for s in stops):
        raise InvalidRequest("'stop_sequences' must be an array of non-empty strings", param="stop_sequences")
    if len(stops) > MAX_STOP_SEQUENCES:
        raise InvalidRequest(f"'stop_sequences' may hold at most {MAX_STOP_SEQUENCES} strings; got {len(stops)}",
                             param="stop_sequences")
    return stops


def strip_billing_preamble(system: str) -> str:
    """``system`` without Claude Code's billing line (``--strip-anthropic-preamble``), as Dynamo strips it.

    The line differs in every session, so at the very start of the prompt it would leave sessions no
    common token prefix for the workers' prefix cache (and the KV router) to reuse. A prompt that starts
    with it (after leading whitespace) loses everything up to and including its first newline; one that
    is nothing but the line, or does not start with it, is left as it is.
    """
    trimmed = system.lstrip()
    if trimmed.startswith(BILLING_HEADER):
        newline = trimmed.find("\n")
        if newline >= 0:
            return trimmed[newline + 1:]
    return system


def _metadata(f: Fields) -> None:
    """``metadata.user_id`` is bookkeeping: accepted, checked, changes nothing about generation."""
    meta = f.obj("metadata")
    if meta is None:
        return
    m = Fields(meta, "metadata.")
    m.str("user_id")
    m.reject_unknown()


def _thinking(f: Fields, max_tokens: int | None) -> tuple[dict[str, Any], int | None]:
    """The chat_template_kwargs ``thinking`` implies ({} when absent), and its budget."""
    raw = f.obj("thinking")
    if raw is None:
        return {}, None
    t = Fields(raw, "thinking.")
    kind = t.str("type", required=True, allowed=("enabled", "disabled", "adaptive"))
    if kind == "disabled":
        t.reject_unknown()
        return {"enable_thinking": False}, None
    display = t.str("display")
    if display not in (None, "summarized"):
        raise InvalidRequest("'thinking.display' 'omitted' is not supported: thinking is always returned",
                             param="thinking.display")
    if kind == "enabled":
        budget = t.int("budget_tokens", UINT32)
        if budget is None:
            raise InvalidRequest("'thinking.budget_tokens' is required when thinking is enabled",
                                 param="thinking.budget_tokens")
        if budget < MIN_THINKING_BUDGET:
            raise InvalidRequest(f"'thinking.budget_tokens' must be >= {MIN_THINKING_BUDGET}; got {budget}",
                                 param="thinking.budget_tokens")
        if max_tokens is not None and budget >= max_tokens:
            raise InvalidRequest(f"'thinking.budget_tokens' ({budget}) must be less than 'max_tokens' ({max_tokens})",
                                 param="thinking.budget_tokens")
    else:
        budget = None
    t.reject_unknown()
    return {"enable_thinking": True}, budget


def _output_config(f: Fields) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """(response_format, chat_template_kwargs) for ``output_config``.

    ``format`` (a JSON schema) is the OpenAI path's ``response_format`` json_schema: guided decoding
    on the worker. ``effort`` low/medium/high is the template's ``reasoning_effort``, as the OpenAI
    path passes it; xhigh and max have no counterpart there, so they are refused.
    """
    raw = f.obj("output_config")
    if raw is None:
        return None, {}
    o = Fields(raw, "output_config.")
    kwargs: dict[str, Any] = {}
    effort = o.str("effort", allowed=("low", "medium", "high", "xhigh", "max"))
    if effort in ("xhigh", "max"):
        raise InvalidRequest(f"'output_config.effort' {effort!r} is not supported; use low, medium or high",
                             param="output_config.effort")
    if effort is not None:
        kwargs["reasoning_effort"] = effort
    response_format = None
    fmt = o.obj("format")
    if fmt is not None:
        fo = Fields(fmt, "output_config.format.")
        fo.str("type", required=True, allowed=("json_schema",))
        schema = fo.obj("schema")
        if schema is None:
            raise InvalidRequest("'output_config.format.schema' is required", param="output_config.format.schema")
        tools_checks.check_schema(schema, "output_config.format.schema")
        fo.reject_unknown()
        response_format = {"type": "json_schema", "schema": schema}
    o.reject_unknown()
    return response_format, kwargs


def _chat(f: Fields, headers: dict[str, str], *, counting: bool, strip_preamble: bool) -> ChatRequest:
    """The fields both endpoints share, and for ``/v1/messages`` the generation ones."""
    model = f.str("model", required=True)
    assert model is not None  # required=True raised otherwise
    messages = content.to_chat_messages(f.raw("system"), f.list("messages"))
    if strip_preamble and messages[0]["role"] == "system":  # only the top-level system prompt has that role
        messages[0]["content"] = strip_billing_preamble(messages[0]["content"])
        if not messages[0]["content"]:
            del messages[0]  # as for an absent system prompt: the template's default applies
    tools = content.to_chat_tools(f.list("tools"))
    tool_choice, parallel = content.to_chat_tool_choice(f.raw("tool_choice"), tools)
    sampling = Sampling()
    stream = False
    if not counting:
        if f.raw("max_tokens") is None:
            raise InvalidRequest("'max_tokens' is required", param="max_tokens")
        sampling = Sampling(max_tokens=f.int("max_tokens", UINT32, 1), temperature=f.float("temperature", 0.0, 1.0),
                            top_p=f.float("top_p", 0.0, 1.0), top_k=f.int("top_k", INT32, 1),
                            stop=_stop_sequences(f))
        stream = f.bool("stream")
        _metadata(f)
        f.str("service_tier", allowed=_SERVICE_TIERS)  # bookkeeping: one tier here
    # Top-level automatic caching, like a block's marker: the workers' prefix cache already applies.
    content.check_cache_control(f.obj("cache_control"), "cache_control")
    response_format, kwargs = _output_config(f)
    thinking_kwargs, sampling.max_thinking_tokens = _thinking(f, sampling.max_tokens)
    kwargs.update(thinking_kwargs)
    f.reject_unknown()
    return ChatRequest(model=model, stream=stream, include_usage=True, n=1, sampling=sampling,
                       pins=read_pins(headers), messages=messages, tools=tools,
                       tool_choice=tool_choice, chat_template_kwargs=kwargs, parallel_tool_calls=parallel,
                       response_format=response_format)


def parse_messages(raw: bytes, headers: dict[str, str] | None = None, *, strip_preamble: bool = False) -> ChatRequest:
    """A ``POST /v1/messages`` body; ``strip_preamble``: without Claude Code's billing line."""
    return _chat(Fields(load_json(raw)), headers or {}, counting=False, strip_preamble=strip_preamble)


def parse_count_tokens(raw: bytes, headers: dict[str, str] | None = None, *,
                       strip_preamble: bool = False) -> ChatRequest:
    """A ``POST /v1/messages/count_tokens`` body: the prompt fields only, as Anthropic takes them; stripped
    as ``/v1/messages`` strips it, so that the count is that of the prompt generation would run."""
    return _chat(Fields(load_json(raw)), headers or {}, counting=True, strip_preamble=strip_preamble)
