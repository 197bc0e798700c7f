"""The embedding worker as a transport-free service: ``EmbedRequest`` in, ``EmbedResponse`` out.

The preprocessor has already tokenized and length-checked the inputs; the checks here repeat the
cheap ones so that a direct gRPC caller gets a 400 naming ``input`` rather than a failed forward pass.
"""

from __future__ import annotations

import logging

import numpy as np
from meshfront.worker.v1 import worker_pb2

from services.common.errors import Internal, InvalidRequest
from services.workers.embed.batcher import EmbedBatcher
from services.workers.embed.model import EmbeddingShape
from services.workers.metrics import worker_metrics

log = logging.getLogger(__name__)


def check_dimensions(requested: int | None, shape: EmbeddingShape, model: str) -> None:
    """``dimensions`` may only restate the model's own size.

    Cutting a vector short keeps its meaning only for Matryoshka-trained models; all-MiniLM-L6-v2 is
    not one, so a shorter vector would be silently worse. OpenAI answers the same request to a model
    without the feature (text-embedding-ada-002) with a 400.
    """
    if requested is not None and requested != shape.dimensions:
        raise InvalidRequest(f"The model `{model}` produces {shape.dimensions}-dimensional embeddings and does not "
                             f"support other sizes (it was not trained for truncation); 'dimensions' must be "
                             f"{shape.dimensions} or left out, got {requested}", param="dimensions")


def check_inputs(inputs: list[list[int]], shape: EmbeddingShape) -> None:
    if not inputs:
        raise InvalidRequest("'input' must not be empty", param="input")
    for i, ids in enumerate(inputs):
        if not ids:
            raise InvalidRequest(f"'input[{i}]' has no tokens", param="input")
        if len(ids) > shape.max_input_tokens:
            raise InvalidRequest(f"This model's maximum input length is {shape.max_input_tokens} tokens; "
                                 f"'input[{i}]' has {len(ids)}", param="input", code="context_length_exceeded")
        if shape.vocab_size and max(ids) >= shape.vocab_size:
            raise InvalidRequest(f"token id {max(ids)} in 'input[{i}]' is out of range for this model's "
                                 f"vocabulary of {shape.vocab_size} tokens", param="input")


def to_little_endian_bytes(row: np.ndarray) -> bytes:
    return row.astype("<f4", copy=False).tobytes()


class EmbedService:
    def __init__(self, shape: EmbeddingShape, batcher: EmbedBatcher, model_name: str):
        self.shape = shape
        self.batcher = batcher
        self.model_name = model_name

    async def embed(self, req: worker_pb2.EmbedRequest) -> worker_pb2.EmbedResponse:
        metrics = worker_metrics()
        metrics.in_flight.inc()
        outcome = "failed"
        try:
            check_dimensions(req.dimensions if req.HasField("dimensions") else None, self.shape, req.model)
            inputs = [list(i.token_ids) for i in req.inputs]
            check_inputs(inputs, self.shape)
            try:
                vectors = await self.batcher.embed(inputs)
            except RuntimeError as e:  # the batcher is shutting down, or the forward pass failed
                raise Internal(f"the embedding worker failed: {e}") from e
            outcome = "finished"
            return worker_pb2.EmbedResponse(embeddings=[to_little_endian_bytes(row) for row in vectors],
                                            dimensions=self.shape.dimensions,
                                            prompt_tokens=sum(len(ids) for ids in inputs))
        except InvalidRequest:
            outcome = "rejected"
            raise
        finally:
            metrics.in_flight.dec()
            metrics.requests.labels(outcome).inc()
