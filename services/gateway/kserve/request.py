"""A KServe ModelInferRequest -> the gateway's parsed OpenAI request (pure: no grpc).

The request is rebuilt as the OpenAI body it stands for and handed to the
very parsers the HTTP API uses (``services/gateway/core/openai_request.py``), so
validation, defaults and error messages are the same on both paths:

- ``text_input`` (BYTES [1])            -> completions ``prompt``
- ``input_ids`` (INT32/INT64 [n])       -> completions ``prompt`` as token ids
- ``messages`` (BYTES [1], JSON array)  -> chat ``messages``; optional ``tools``
  (BYTES [1], JSON array); or parameter ``chat=true`` with ``text_input`` as
  one user message
- ``stream`` / ``streaming`` (BOOL [1]) or parameter ``stream``: one response
  per chunk on ModelStreamInfer (its default) or one folded response
- request parameters: the sampling and output controls in ``SAMPLING_PARAMS``
  (and ``CHAT_PARAMS`` for chat), typed as KServe parameters; ``stop`` and the
  JSON-valued ones are strings. Anything else is INVALID_ARGUMENT naming it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import orjson

from services.common.errors import InvalidRequest
from services.gateway.core.openai_request import parse_chat, parse_completion
from services.gateway.core.request import ChatRequest, CompletionRequest
from services.gateway.kserve.render import CHAT_OUTPUTS, TEXT_OUTPUTS
from services.gateway.kserve.tensors import Tensor, one_bool, one_string, read_inputs, token_ids

SAMPLING_PARAMS = frozenset({
    "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "frequency_penalty", "presence_penalty",
    "repetition_penalty", "min_tokens", "ignore_eos", "stop", "include_stop_str_in_output", "skip_special_tokens",
})
CHAT_PARAMS = frozenset({"max_completion_tokens", "tool_choice", "chat_template_kwargs", "reasoning_effort"})
# Parameters whose string value holds JSON (``stop`` may also be a plain string).
_JSON_PARAMS = frozenset({"chat_template_kwargs"})
CONTROL_PARAMS = frozenset({"chat", "stream", "triton_enable_empty_final_response"})
INPUTS = frozenset({"text_input", "input_ids", "messages", "tools", "stream", "streaming"})


@dataclasses.dataclass
class KServeRequest:
    """A validated KServe request and how to answer it."""

    parsed: ChatRequest | CompletionRequest
    chat: bool
    stream: bool | None  # None: the RPC's default
    empty_final: bool  # Triton's triton_enable_empty_final_response
    outputs: tuple[str, ...]


def parameter_values(params) -> dict[str, Any]:
    """A protobuf map<string, InferParameter> as plain Python values.

    Numbers are range-checked by the OpenAI parser they are handed to, except what JSON cannot
    carry there: a NaN or infinite ``double_param`` (orjson would write it as null, dropping it).
    """
    out = {}
    for key, p in params.items():
        kind = p.WhichOneof("parameter_choice")
        if kind is None:
            raise InvalidRequest(f"parameter '{key}' has no value", param=key)
        value = getattr(p, kind)
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidRequest(f"parameter '{key}' must be a finite number; got {value}", param=key)
        out[key] = value
    return out


def _json_param(key: str, value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        raise InvalidRequest(f"parameter '{key}' must be a JSON string; got {value!r}", param=key) from None


def _stop(value: Any) -> Any:
    if isinstance(value, str) and value.startswith("["):
        return _json_param("stop", value)
    return value


def _tool_choice(value: Any) -> Any:
    if isinstance(value, str) and value.startswith("{"):
        return _json_param("tool_choice", value)
    return value


def _body_params(params: dict[str, Any], chat: bool) -> dict[str, Any]:
    allowed = SAMPLING_PARAMS | CONTROL_PARAMS | (CHAT_PARAMS if chat else frozenset())
    unknown = sorted(k for k in params if k not in allowed)
    if unknown:
        hint = " (chat-only; send a 'messages' input or chat=true)" if set(unknown) <= CHAT_PARAMS else ""
        raise InvalidRequest(f"Unsupported parameter(s): {', '.join(repr(k) for k in unknown)}{hint}",
                             param=unknown[0])
    body = {k: v for k, v in params.items() if k in SAMPLING_PARAMS or k in CHAT_PARAMS}
    if "stop" in body:
        body["stop"] = _stop(body["stop"])
    if "tool_choice" in body:
        body["tool_choice"] = _tool_choice(body["tool_choice"])
    for key in _JSON_PARAMS & body.keys():
        body[key] = _json_param(key, body[key])
    return body


def _json_input(t: Tensor) -> Any:
    text = one_string(t)
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise InvalidRequest(f"input '{t.name}' must hold JSON: {e}", param=t.name) from None


def _control_bool(params: dict[str, Any], key: str) -> bool | None:
    v = params.get(key)
    if v is not None and not isinstance(v, bool):
        raise InvalidRequest(f"parameter '{key}' must be a bool", param=key)
    return v


def _stream_flag(inputs: dict[str, Tensor], params: dict[str, Any]) -> bool | None:
    flags = [one_bool(inputs[k]) for k in ("stream", "streaming") if k in inputs]
    p = _control_bool(params, "stream")
    if p is not None:
        flags.append(p)
    if len(set(flags)) > 1:
        raise InvalidRequest("'stream' is given more than once with different values", param="stream")
    return flags[0] if flags else None


def _chat_body(inputs: dict[str, Tensor]) -> dict[str, Any]:
    if "messages" in inputs:
        if "text_input" in inputs:
            raise InvalidRequest("send either 'messages' or 'text_input', not both", param="text_input")
        messages = _json_input(inputs["messages"])
    elif "text_input" in inputs:
        messages = [{"role": "user", "content": one_string(inputs["text_input"])}]
    else:
        raise InvalidRequest("a chat request needs a 'messages' input (or 'text_input' with chat=true)",
                             param="messages")
    body: dict[str, Any] = {"messages": messages}
    if "tools" in inputs:
        body["tools"] = _json_input(inputs["tools"])
    return body


def _completion_body(inputs: dict[str, Tensor]) -> dict[str, Any]:
    if "tools" in inputs:
        raise InvalidRequest("input 'tools' needs a chat request ('messages' input or chat=true)", param="tools")
    if "text_input" in inputs and "input_ids" in inputs:
        raise InvalidRequest("send either 'text_input' or 'input_ids', not both", param="input_ids")
    if "input_ids" in inputs:
        return {"prompt": token_ids(inputs["input_ids"])}
    if "text_input" in inputs:
        return {"prompt": one_string(inputs["text_input"])}
    raise InvalidRequest("the request needs a 'text_input' (BYTES) or 'input_ids' (INT32/INT64) input",
                         param="text_input")


def _outputs(request, chat: bool) -> tuple[str, ...]:
    """The outputs asked for, or every output of the request's kind (render.py says what each holds)."""
    produced = CHAT_OUTPUTS if chat else TEXT_OUTPUTS
    names = tuple(o.name for o in request.outputs)
    unknown = [n for n in names if n not in produced]
    if unknown:
        hint = " (chat only: send a 'messages' input or chat=true)" if set(unknown) <= set(CHAT_OUTPUTS) else ""
        raise InvalidRequest(f"unknown output(s) {', '.join(map(repr, unknown))}; this request produces "
                             f"{', '.join(produced)}{hint}", param=unknown[0])
    return names or produced


def parse_request(request, headers: dict[str, str] | None = None) -> KServeRequest:
    """Validates a ModelInferRequest and parses it with the HTTP API's own parsers."""
    inputs = read_inputs(request)
    unknown = sorted(inputs.keys() - INPUTS)
    if unknown:
        raise InvalidRequest(f"unknown input(s) {', '.join(map(repr, unknown))}; accepted inputs: "
                             f"{', '.join(sorted(INPUTS))}", param=unknown[0])
    params = parameter_values(request.parameters)
    chat = "messages" in inputs or bool(_control_bool(params, "chat"))
    if "input_ids" in inputs and chat:
        raise InvalidRequest("'input_ids' is a pre-tokenized prompt; it cannot be combined with chat",
                             param="input_ids")
    body = {"model": request.model_name, **_body_params(params, chat)}
    body |= _chat_body(inputs) if chat else _completion_body(inputs)
    raw = orjson.dumps(body)
    parsed = parse_chat(raw, headers) if chat else parse_completion(raw, headers)
    return KServeRequest(parsed=parsed, chat=chat, stream=_stream_flag(inputs, params),
                         empty_final=bool(_control_bool(params, "triton_enable_empty_final_response")),
                         outputs=_outputs(request, chat))
