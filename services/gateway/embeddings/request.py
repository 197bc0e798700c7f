"""The embeddings request body, validated: every field read, every unknown field a 400 naming it.

OpenAI's fields (https://platform.openai.com/docs/api-reference/embeddings/create):

- ``model`` (required);
- ``input`` (required): a string, an array of strings, an array of token ids, or an array of
  token-id arrays; never empty, no empty string. Token ids are the *model's* ids (the mesh has no
  cl100k tokenizer), used as given (services/preprocessor/core/embeddings.py);
- ``encoding_format``: ``float`` (the default) or ``base64`` (little-endian float32, which the
  ``openai`` SDK asks for by default and decodes itself);
- ``dimensions``: a positive integer; whether the model can honour it is the worker's call;
- ``user``: accepted and ignored (bookkeeping, as on the chat endpoints).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from services.common.errors import InvalidRequest
from services.gateway.core.fields import UINT32, Fields, token_ids
from services.gateway.core.request import load_json

ENCODING_FORMATS = ("float", "base64")
# OpenAI's limit on inputs per request.
MAX_INPUTS = 2048


@dataclasses.dataclass(frozen=True)
class EmbeddingsRequest:
    model: str
    inputs: list[str | list[int]]
    encoding_format: str = "float"
    dimensions: int | None = None
    user: str | None = None


def _inputs(v: Any) -> list[str | list[int]]:
    if isinstance(v, str):
        inputs: list[str | list[int]] = [v]
    elif isinstance(v, list) and v and all(isinstance(x, str) for x in v):
        inputs = list(v)
    elif isinstance(v, list) and v and all(isinstance(x, list) for x in v):
        inputs = [token_ids(x, "input", f"input[{i}]") for i, x in enumerate(v)]
    elif isinstance(v, list) and v and not any(isinstance(x, (str, list, dict)) for x in v):
        inputs = [token_ids(v, "input")]
    else:
        raise InvalidRequest("'input' must be a non-empty string, array of strings, array of token ids, "
                             "or array of token-id arrays", param="input")
    if len(inputs) > MAX_INPUTS:
        raise InvalidRequest(f"'input' may hold at most {MAX_INPUTS} inputs; got {len(inputs)}", param="input")
    for i, x in enumerate(inputs):
        if x == "":
            raise InvalidRequest(f"'input[{i}]' must not be an empty string" if len(inputs) > 1
                                 else "'input' must not be an empty string", param="input")
    return inputs


def parse_embeddings(raw: bytes) -> EmbeddingsRequest:
    body = load_json(raw)
    f = Fields(body)
    model = f.str("model", required=True)
    assert model is not None  # required
    if f.raw("input") is None:
        raise InvalidRequest("'input' is required", param="input")
    inputs = _inputs(body["input"])
    encoding = f.str("encoding_format", allowed=ENCODING_FORMATS) or "float"
    dimensions = f.int("dimensions", UINT32, lo=1)
    user = f.str("user")
    f.reject_unknown()
    return EmbeddingsRequest(model=model, inputs=inputs, encoding_format=encoding, dimensions=dimensions, user=user)
