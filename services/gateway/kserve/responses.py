"""Gateway deltas -> KServe ModelInferResponse messages (pure: no grpc).

Streamed responses carry Triton's decoupled-model marker: the parameter
``triton_final_response`` is false on every response but the request's last.
The last data response carries true (it is the one with a finish reason),
unless the client asked for ``triton_enable_empty_final_response``: then every
data response says false and an empty response with true closes the request,
as Triton does.
"""

from __future__ import annotations

import dataclasses

from services.gateway.kserve import protocol
from services.gateway.kserve.tensors import bytes_output
from services.gateway.openai.responses import Delta

MODEL_VERSION = "1"
FINAL = "triton_final_response"


@dataclasses.dataclass
class Usage:
    """Token counts, reported as response parameters on the last response."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, deltas: list[Delta]) -> None:
        for d in deltas:
            self.prompt_tokens += d.prompt_tokens if d.counts_prompt else 0
            self.completion_tokens += d.completion_tokens


class ResponseBuilder:
    """Builds the responses of one request: id, model, requested outputs, usage, final marker."""

    def __init__(self, model: str, request_id: str, outputs: tuple[str, ...], *, decoupled: bool,
                 empty_final: bool = False):
        self.model = model
        self.request_id = request_id
        self.outputs = outputs
        self.decoupled = decoupled
        self.empty_final = empty_final
        self.usage = Usage()
        self.finished = False
        self.sent_final = False

    def _base(self):
        return protocol.ModelInferResponse(model_name=self.model, model_version=MODEL_VERSION, id=self.request_id)

    def _mark_final(self, resp, final: bool) -> None:
        if final:
            resp.parameters["prompt_tokens"].int64_param = self.usage.prompt_tokens
            resp.parameters["completion_tokens"].int64_param = self.usage.completion_tokens
        if self.decoupled:
            resp.parameters[FINAL].bool_param = final

    def data(self, deltas: list[Delta]):
        """A response holding the deltas' text.

        Unary responses are always final. A streamed one is final when it
        carries the finish reason, unless an empty final response will follow.
        """
        self.usage.add(deltas)
        finish = None
        for d in deltas:
            finish = d.finish_reason or finish
        self.finished = self.finished or finish is not None
        resp = self._base()
        values = {"text_output": "".join(d.text for d in deltas).encode(), "finish_reason": (finish or "").encode()}
        for name in self.outputs:
            bytes_output(resp, name, [values[name]])
        final = not self.decoupled or (finish is not None and not self.empty_final)
        self._mark_final(resp, final)
        self.sent_final = self.sent_final or final
        return resp

    def empty_final_response(self):
        """The closing response without outputs (Triton's empty final response)."""
        resp = self._base()
        self._mark_final(resp, True)
        return resp

    def closing(self):
        """The response that still has to close a streamed request, or None when one said final."""
        return self.empty_final_response() if self.decoupled and not self.sent_final else None
