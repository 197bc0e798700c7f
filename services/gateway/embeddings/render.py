"""The embeddings response body: OpenAI's list of ``embedding`` objects and its usage.

The worker sends each vector as little-endian float32 bytes. ``base64`` is those bytes encoded as
they are (what OpenAI sends and the ``openai`` SDK decodes with ``numpy.frombuffer(..., "float32")``);
``float`` hands orjson a float32 array, which it writes as the shortest decimal that reads back as
the same float32, so both formats carry exactly the same values.
"""

from __future__ import annotations

import base64

import numpy as np
import orjson
from meshfront.worker.v1 import worker_pb2


def render(model: str, resp: worker_pb2.EmbedResponse, encoding_format: str) -> bytes:
    data = []
    for index, raw in enumerate(resp.embeddings):
        vector: str | np.ndarray = (base64.b64encode(raw).decode() if encoding_format == "base64"
                                    else np.frombuffer(raw, dtype="<f4"))
        data.append({"object": "embedding", "index": index, "embedding": vector})
    usage = {"prompt_tokens": resp.prompt_tokens, "total_tokens": resp.prompt_tokens}
    return orjson.dumps({"object": "list", "data": data, "model": model, "usage": usage},
                        option=orjson.OPT_SERIALIZE_NUMPY)
