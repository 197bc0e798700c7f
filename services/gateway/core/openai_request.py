"""Parses and validates OpenAI chat and completions bodies into plain dataclasses.

Every field a client may send is either carried to the mesh or refused with a
400 that names it; nothing is silently dropped. Ranges follow the OpenAI API
(and Dynamo's validate.rs where OpenAI is silent).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from services.common.errors import InvalidRequest
from services.gateway.core import tools as tools_checks
from services.gateway.core.fields import INT32, INT64, UINT32, UINT64, Fields, IntType, token_ids
from services.gateway.core.media import Media, check_content_parts
from services.gateway.core.nvext import parse_nvext
from services.gateway.core.openai_fields import parse_openai_options
from services.gateway.core.request import ChatRequest, CompletionRequest, GenerationRequest, Sampling, load_json
from services.gateway.core.structured import parse_structured_outputs
from services.gateway.core.vendor import parse_vendor_chat_fields

MAX_N = 128
MAX_STOP = 32
MAX_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5
MAX_BEST_OF = 20
# A seed lands in a uint64; a negative one (int64, as vLLM and PyTorch take it) wraps around.
_SEED = IntType("int64 or uint64", INT64.lo, UINT64.hi)
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
# Accepted on /v1/completions because they change nothing about generation (bookkeeping fields);
# chat checks them and the other current OpenAI fields in openai_fields.py.
_NO_OP_FIELDS = ("user", "metadata", "store", "service_tier")


def _shared(base: GenerationRequest) -> dict[str, Any]:
    """The fields both endpoints parse, as keyword arguments (shallow: nested objects are kept)."""
    return {f.name: getattr(base, f.name) for f in dataclasses.fields(GenerationRequest)}


def _stop(f: Fields) -> list[str]:
    v = f.raw("stop")
    if v is None:
        return []
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise InvalidRequest("'stop' must be a string or an array of strings", param="stop")
    if len(stops) > MAX_STOP:
        raise InvalidRequest(f"'stop' may hold at most {MAX_STOP} strings; got {len(stops)}", param="stop")
    if any(s == "" for s in stops):
        raise InvalidRequest("'stop' strings must not be empty", param="stop")
    return stops


def _include_usage(f: Fields, stream: bool) -> bool:
    stream_options = f.obj("stream_options")
    if stream_options is None:
        return False
    if not stream:
        raise InvalidRequest("'stream_options' is only allowed when 'stream' is true", param="stream_options")
    so = Fields(stream_options, "stream_options.")
    include_usage = so.bool("include_usage")
    so.bool("include_obfuscation")  # no obfuscation padding is ever added; the field is accepted
    so.reject_unknown()
    return include_usage


def _check_sampling(s: Sampling) -> None:
    """What the ranges alone do not say; a negative seed is taken as its 64-bit two's complement."""
    if s.top_k == 0:
        raise InvalidRequest("'top_k' must be -1 (disabled) or >= 1; got 0", param="top_k")
    if s.repetition_penalty is not None and s.repetition_penalty <= 0:
        raise InvalidRequest("'repetition_penalty' must be in (0, 2]", param="repetition_penalty")
    if s.seed is not None and s.seed < 0:
        s.seed &= 2**64 - 1


def _common(f: Fields, headers: dict[str, str], *, max_tokens_key: str) -> GenerationRequest:
    model = f.required_str("model")
    stream = f.bool("stream")
    include_usage = _include_usage(f, stream)
    # Each integer names the proto type it lands in (common.proto); ``n`` stays in the gateway.
    n = f.int("n", UINT32, 1, MAX_N) or 1
    s = Sampling(
        temperature=f.float("temperature", 0.0, 2.0),
        top_p=f.float("top_p", 0.0, 1.0),
        top_k=f.int("top_k", INT32, -1),
        min_p=f.float("min_p", 0.0, 1.0),
        seed=f.int("seed", _SEED),
        frequency_penalty=f.float("frequency_penalty", -2.0, 2.0),
        presence_penalty=f.float("presence_penalty", -2.0, 2.0),
        repetition_penalty=f.float("repetition_penalty", 0.0, 2.0),
        min_tokens=f.int("min_tokens", UINT32, 0),
        ignore_eos=f.bool("ignore_eos"),
        stop=_stop(f),
        include_stop_str_in_output=f.bool("include_stop_str_in_output"),
        skip_special_tokens=f.bool("skip_special_tokens"),
    )
    _check_sampling(s)
    max_tokens = f.int("max_tokens", UINT32, 1)
    if max_tokens_key == "max_completion_tokens":
        mct = f.int("max_completion_tokens", UINT32, 1)
        max_tokens = mct if mct is not None else max_tokens
    s.max_tokens = max_tokens
    if s.min_tokens and s.max_tokens is not None and s.min_tokens > s.max_tokens:
        raise InvalidRequest("'min_tokens' must not exceed the maximum number of tokens", param="min_tokens")
    logit_bias = f.obj("logit_bias")
    if logit_bias:
        raise InvalidRequest("'logit_bias' is not supported by this server", param="logit_bias")
    for key in _NO_OP_FIELDS:
        f.raw(key)
    stop_ids = f.list("stop_token_ids")
    if stop_ids is not None:
        s.stop_token_ids = token_ids(stop_ids, "stop_token_ids") if stop_ids else []
    nvext = parse_nvext(f.obj("nvext"), headers)
    s.max_thinking_tokens = nvext.max_thinking_tokens
    if nvext.greedy:
        # Greedy decoding: the most likely token every step, so no temperature and no nucleus cut.
        s.temperature, s.top_p = 0.0, None
    if n > 1 and s.temperature == 0.0:
        raise InvalidRequest("'n' > 1 needs a temperature above 0 (greedy choices would all be the same)", param="n")
    return GenerationRequest(model=model, stream=stream, include_usage=include_usage, n=n, sampling=s,
                             pins=nvext.pins, structured=parse_structured_outputs(f), nvext=nvext,
                             session_id=nvext.session_id)


def _message(i: int, m: Any, media: list[Media]) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise InvalidRequest(f"'{where}' must be an object", param=where)
    role = m.get("role")
    if role not in CHAT_ROLES:
        raise InvalidRequest(f"'{where}.role' must be one of {', '.join(CHAT_ROLES)}; got {role!r}",
                             param=f"{where}.role")
    content = m.get("content")
    if content is None:
        if not (role == "assistant" and m.get("tool_calls")):
            raise InvalidRequest(f"'{where}.content' is required for role {role!r}", param=f"{where}.content")
    elif isinstance(content, list):
        media.extend(check_content_parts(i, role, content))
    elif not isinstance(content, str):
        raise InvalidRequest(f"'{where}.content' must be a string or an array of parts", param=f"{where}.content")
    if role == "tool" and not isinstance(m.get("tool_call_id"), str):
        raise InvalidRequest(f"'{where}.tool_call_id' is required for tool messages", param=f"{where}.tool_call_id")
    for key in ("name", "reasoning_content", "reasoning"):
        if m.get(key) is not None and not isinstance(m[key], str):
            raise InvalidRequest(f"'{where}.{key}' must be a string", param=f"{where}.{key}")
    if m.get("tool_calls") is not None:
        _check_tool_calls(where, role, m["tool_calls"])
    return m


def _check_tool_calls(where: str, role: str, calls: Any) -> None:
    """An assistant's earlier tool calls, in OpenAI's shape, checked here so that a malformed one is a 400
    naming its path rather than a chat template failing on it (and its error text reaching the client)."""
    if role != "assistant":
        raise InvalidRequest(f"'{where}.tool_calls' is only allowed in assistant messages, not {role!r}",
                             param=f"{where}.tool_calls")
    if not isinstance(calls, list):
        raise InvalidRequest(f"'{where}.tool_calls' must be an array", param=f"{where}.tool_calls")
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        if not isinstance(call, dict):
            raise InvalidRequest(f"'{at}' must be an object", param=at)
        if not isinstance(call.get("id"), str):
            raise InvalidRequest(f"'{at}.id' must be a string", param=f"{at}.id")
        if call.get("type", "function") != "function":
            raise InvalidRequest(f"'{at}.type' must be 'function'", param=f"{at}.type")
        fn = call.get("function")
        if not isinstance(fn, dict):
            raise InvalidRequest(f"'{at}.function' must be an object with 'name' and 'arguments'",
                                 param=f"{at}.function")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise InvalidRequest(f"'{at}.function.name' must be a non-empty string", param=f"{at}.function.name")
        if not isinstance(fn.get("arguments"), str):
            raise InvalidRequest(f"'{at}.function.arguments' must be a string (JSON-encoded arguments)",
                                 param=f"{at}.function.arguments")


def parse_chat(raw: bytes, headers: dict[str, str] | None = None) -> ChatRequest:
    body = load_json(raw)
    f = Fields(body)
    if "functions" in body or "function_call" in body:
        raise InvalidRequest("'functions' and 'function_call' are deprecated; use 'tools' and 'tool_choice'",
                             param="functions")
    messages = f.list("messages")
    if not messages:
        raise InvalidRequest("'messages' must be a non-empty array", param="messages")
    media: list[Media] = []
    messages = [_message(i, m, media) for i, m in enumerate(messages)]
    base = _common(f, headers or {}, max_tokens_key="max_completion_tokens")
    if base.nvext.token_data is not None:
        media = []  # the pre-tokenized prompt replaces the messages, their media included
    logprobs = f.bool("logprobs")
    top = f.int("top_logprobs", UINT32, 0, MAX_TOP_LOGPROBS)
    if top is not None and not logprobs:
        raise InvalidRequest("'top_logprobs' requires 'logprobs' to be true", param="top_logprobs")
    base.sampling.logprobs = (top or 0) if logprobs else None
    tools = tools_checks.check_tools(f.list("tools"))
    tool_choice = tools_checks.check_tool_choice(f.raw("tool_choice"), tools)
    parallel = f.bool("parallel_tool_calls", True)
    kwargs = dict(f.obj("chat_template_kwargs") or {})
    kwargs.update(f.obj("chat_template_args") or {})
    # The client's own template variables win over those derived from OpenAI and vendor fields.
    options = parse_openai_options(f)
    vendor = parse_vendor_chat_fields(f)
    for key, value in {**options.template_kwargs, **vendor.template_kwargs}.items():
        kwargs.setdefault(key, value)
    if vendor.max_thinking_tokens is not None and base.sampling.max_thinking_tokens is None:
        base.sampling.max_thinking_tokens = vendor.max_thinking_tokens
    base.session_id = base.session_id or options.prompt_cache_key
    response_format = tools_checks.check_response_format(f.obj("response_format"))
    if base.structured is not None and (response_format is not None or tool_choice == "required"
                                        or isinstance(tool_choice, dict)):
        raise InvalidRequest("structured outputs cannot be combined with 'response_format' or a forced "
                             "'tool_choice'", param="structured_outputs")
    f.reject_unknown()
    return ChatRequest(**_shared(base), messages=messages, tools=tools,
                       tool_choice=tool_choice, chat_template_kwargs=kwargs, parallel_tool_calls=parallel,
                       response_format=response_format, media=media)


def _prompts(v: Any) -> list[str | list[int]]:
    if isinstance(v, str):
        return [v]
    if isinstance(v, list) and v:
        if all(isinstance(x, str) for x in v):
            return list(v)
        if all(isinstance(x, list) for x in v):
            return [token_ids(x, "prompt", f"prompt[{i}]") for i, x in enumerate(v)]
        if not any(isinstance(x, (str, list, dict)) for x in v):
            return [token_ids(v, "prompt")]
    raise InvalidRequest("'prompt' must be a non-empty string, array of strings, array of token ids, "
                         "or array of token-id arrays", param="prompt")


def parse_completion(raw: bytes, headers: dict[str, str] | None = None) -> CompletionRequest:
    body = load_json(raw)
    f = Fields(body)
    if f.raw("prompt") is None:
        raise InvalidRequest("'prompt' is required", param="prompt")
    prompts = _prompts(body["prompt"])
    if any(p == "" for p in prompts):
        raise InvalidRequest("'prompt' must not be empty", param="prompt")
    base = _common(f, headers or {}, max_tokens_key="max_tokens")
    if base.nvext.token_data is not None:
        prompts = [base.nvext.token_data]  # pinned and pre-tokenized: the one prompt
    if base.sampling.max_tokens is None:
        base.sampling.max_tokens = 16  # the OpenAI default for completions
    logprobs = f.int("logprobs", UINT32, 0, MAX_COMPLETION_LOGPROBS)
    base.sampling.logprobs = logprobs
    echo = f.bool("echo")
    if echo and any(not isinstance(p, str) for p in prompts):
        raise InvalidRequest("'echo' is only supported with text prompts", param="echo")
    best_of = f.int("best_of", UINT32, 1, MAX_BEST_OF)
    if best_of is not None and best_of != base.n:
        raise InvalidRequest("'best_of' other than 'n' is not supported", param="best_of")
    if f.str("suffix"):
        raise InvalidRequest("'suffix' is not supported", param="suffix")
    if len(prompts) * base.n > MAX_N:
        raise InvalidRequest(f"batch size times 'n' must be at most {MAX_N}", param="n")
    f.reject_unknown()
    return CompletionRequest(**_shared(base), prompts=prompts, echo=echo)
