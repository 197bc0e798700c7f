"""Gateway deltas -> KServe ModelInferResponse messages (pure: no grpc).

Output tensors, each BYTES with one element per response (the names are documented in
docs/architecture.md, KServe section, and announced by ModelMetadata):

- ``text_output``: the generated text (its new part on a streamed response);
- ``finish_reason``: ``stop``, ``length`` or ``tool_calls`` on the response that ends the request, else empty;
- ``reasoning_content``: the reasoning the model's reasoning parser split off, as OpenAI's
  ``reasoning_content`` (chat);
- ``tool_calls``: a JSON array of the tool calls the tool parser found, in OpenAI's shapes: a streamed
  response carries the chunks' ``tool_calls`` deltas (``index``, then ``id``/``type``/``name`` on a
  call's first delta, argument fragments after), a folded one the whole calls (``id``, ``type``,
  ``function.name``, ``function.arguments``); ``[]`` when there are none (chat).

A chat request gets all four unless it names the outputs it wants; a completions request gets
``text_output`` and ``finish_reason`` (its model output is never split into reasoning or tool calls).

Streamed responses carry Triton's decoupled-model marker: the parameter ``triton_final_response`` is
false on every response but the request's last. The last data response carries true (it is the one
with a finish reason), unless the client asked for ``triton_enable_empty_final_response``: then every
data response says false and an empty response with true closes the request, as Triton does.
"""

from __future__ import annotations

from typing import Any

import orjson

from services.common.errors import MeshError
from services.gateway.core.delta import Delta, fold_tool_calls, joined_tool_calls, tool_call_chunk
from services.gateway.kserve import protocol
from services.gateway.kserve.tensors import bytes_output

MODEL_VERSION = "1"
FINAL = "triton_final_response"
TEXT_OUTPUTS = ("text_output", "finish_reason")
CHAT_OUTPUTS = (*TEXT_OUTPUTS, "reasoning_content", "tool_calls")


def error_response(err: MeshError):
    """Triton's way on a stream: the failed request's ``error_message``; tritonclient hands it to the
    callback, and the stream goes on serving the call's other requests."""
    return protocol.ModelStreamInferResponse(error_message=f"{err.grpc_code.name}: {err.message}")


class InferResponseBuilder:
    """The responses of one request: id, model, requested outputs, usage, final marker.

    It is the front door's renderer for KServe (``fold`` / ``body``, ``sse`` / ``sse_end`` /
    ``sse_error``); each returns the list of messages to send.
    """

    def __init__(self, model: str, request_id: str, outputs: tuple[str, ...], *, decoupled: bool,
                 empty_final: bool = False):
        self.model = model
        self.request_id = request_id
        self.outputs = outputs
        self.decoupled = decoupled
        self.empty_final = empty_final
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.finished = False
        self.sent_final = False
        # Folding (one response for the whole request): text, reasoning and tool calls so far.
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._calls: list[dict[str, Any]] = []
        self._finish: str | None = None

    def _account(self, deltas: list[Delta]) -> str | None:
        finish = None
        for d in deltas:
            self.completion_tokens += d.completion_tokens
            if d.counts_prompt:
                self.prompt_tokens += d.prompt_tokens
                self.cached_tokens += d.cached_tokens
            finish = d.finish_reason or finish
        self.finished = self.finished or finish is not None
        return finish

    def _base(self):
        return protocol.ModelInferResponse(model_name=self.model, model_version=MODEL_VERSION, id=self.request_id)

    def _mark_final(self, resp, final: bool) -> None:
        if final:
            resp.parameters["prompt_tokens"].int64_param = self.prompt_tokens
            resp.parameters["completion_tokens"].int64_param = self.completion_tokens
        if self.decoupled:
            resp.parameters[FINAL].bool_param = final

    def _response(self, text: str, reasoning: str, calls: list[dict[str, Any]], finish: str | None):
        """A data response: the requested outputs, final when it carries the finish reason (unless an
        empty final response will follow) or always when unary."""
        resp = self._base()
        for name in self.outputs:
            if name == "text_output":
                value = text.encode()
            elif name == "finish_reason":
                value = (finish or "").encode()
            elif name == "reasoning_content":
                value = reasoning.encode()
            else:
                value = orjson.dumps(calls)
            bytes_output(resp, name, [value])
        final = not self.decoupled or (finish is not None and not self.empty_final)
        self._mark_final(resp, final)
        self.sent_final = self.sent_final or final
        return resp

    def data(self, deltas: list[Delta]):
        """One response holding the deltas' new output (streamed: tool calls as their chunks)."""
        finish = self._account(deltas)
        text = "".join(d.text for d in deltas)
        # Once per batch, and only what the request asked for (a completion never asks for these).
        reasoning = "".join(d.reasoning for d in deltas if d.reasoning) if "reasoning_content" in self.outputs else ""
        calls = [tool_call_chunk(c) for d in deltas for c in d.tool_calls] if "tool_calls" in self.outputs else []
        return self._response(text, reasoning, calls, finish)

    def empty_final_response(self):
        """The closing response without outputs (Triton's empty final response)."""
        resp = self._base()
        self._mark_final(resp, True)
        return resp

    def closing(self):
        """The response that still has to close a streamed request, or None when one said final."""
        return self.empty_final_response() if self.decoupled and not self.sent_final else None

    # ---- the front door's renderer --------------------------------------------------------------------------

    def fold(self, deltas: list[Delta]) -> None:
        self._finish = self._account(deltas) or self._finish
        for d in deltas:
            self._text.append(d.text)
            if d.reasoning:
                self._reasoning.append(d.reasoning)
            fold_tool_calls(self._calls, d.tool_calls)

    def body(self) -> list[Any]:
        resp = self._response("".join(self._text), "".join(self._reasoning), joined_tool_calls(self._calls),
                              self._finish)
        closing = self.closing()
        return [resp] if closing is None else [resp, closing]

    def sse(self, deltas: list[Delta]) -> list[Any]:
        return [self.data(deltas)]

    def sse_end(self) -> list[Any]:
        closing = self.closing()
        return [] if closing is None else [closing]

    def sse_error(self, err: MeshError) -> list[Any]:
        return [error_response(err)]

    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens}
