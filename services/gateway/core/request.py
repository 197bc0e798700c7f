"""The gateway's request types: what every front end parses its body into.

Chat, completions, Anthropic Messages, Responses and KServe all end up as a ``ChatRequest`` or a
``CompletionRequest`` (the Anthropic, Responses and KServe parsers build one), which
core/to_proto.py turns into the preprocessor's request. The parsers live with their front ends
(core/openai_request.py, anthropic/request.py, ...); ``load_json`` is the body check they all begin with.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson

from services.common.errors import InvalidRequest
from services.gateway.core.media import Media
from services.gateway.core.nvext import NvExt
from services.gateway.core.pins import Pins
from services.gateway.core.trace import RouteHints


@dataclasses.dataclass
class Sampling:
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    max_tokens: int | None = None
    min_tokens: int | None = None
    ignore_eos: bool = False
    stop: list[str] = dataclasses.field(default_factory=list)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = False
    logprobs: int | None = None  # number of alternatives; None = no logprobs
    stop_token_ids: list[int] = dataclasses.field(default_factory=list)
    max_thinking_tokens: int | None = None


@dataclasses.dataclass
class GenerationRequest:
    """What both endpoints share once parsed."""

    model: str
    stream: bool
    include_usage: bool
    n: int
    sampling: Sampling
    pins: Pins = Pins()  # core/pins.py: the same for every front end
    # vLLM-style structured outputs as GuidedDecoding fields (structured.py); None: unconstrained.
    structured: dict[str, Any] | None = None
    nvext: NvExt = dataclasses.field(default_factory=NvExt)
    # Sticky routing key: nvext.session_control.session_id, else prompt_cache_key.
    session_id: str = ""

    @property
    def worker_id(self) -> str:
        """The pinned (aggregated, or decode) worker; "" lets the router choose."""
        return self.pins.worker_id

    def route_hints(self) -> RouteHints:
        """What the router is asked besides the prompt: the pins and ``nvext``'s session and priority."""
        ext = self.nvext
        return RouteHints(self.session_id, ext.session_action, ext.session_timeout_s, ext.priority_jump_s,
                          self.pins.prefill_worker_id, self.pins.decode_worker_id, "routing" in ext.extra_fields,
                          self.pins.names, ext.affinity_session_id, self.pins.dp_rank, self.pins.prefill_dp_rank)


@dataclasses.dataclass
class ChatRequest(GenerationRequest):
    messages: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    chat_template_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    parallel_tool_calls: bool = True
    # Validated response_format: None (text), {"type": "json_object"} or {"type": "json_schema", "schema": {...}}.
    response_format: dict[str, Any] | None = None
    media: list[Media] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class CompletionRequest(GenerationRequest):
    # Each prompt is a string or a list of token ids.
    prompts: list[str | list[int]] = dataclasses.field(default_factory=list)
    echo: bool = False


def load_json(raw: bytes) -> dict[str, Any]:
    if not raw:
        raise InvalidRequest("The request body is empty; expected a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise InvalidRequest(f"The request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object")
    return body
