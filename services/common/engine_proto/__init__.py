"""Meshfront's worker requests and responses in SMG's engine proto (PyPI ``smg-grpc-proto``), per service.

A stock engine's own gRPC server (vLLM's ``--grpc``, SGLang's ``--grpc-mode``, TensorRT-LLM's ``--grpc``)
speaks one of three services of that proto; a worker card's ``engine_protocol`` names which
(services/common/cards.py). This package is the pure mapping between our ``PreprocessedRequest`` /
``worker_pb2.GenerateResponse`` and each service's Generate and Embed messages: no channels, no grpc,
so every field it sets is checked against the package's real classes by unit tests
(tests/unit/engine_proto). The client that calls engines with it is services/postprocessor/engine_client.py.

What the proto cannot carry for a service is refused before any call (``refusal``): the request becomes a
400 naming the reason, never a silent drop. docs/engine-grpc.md ("The data path") lists the mapping.
"""

from services.common.engine_proto.requests import (
    SAMPLING_DEFAULT_KNOBS,
    Unsupported,
    abort_request,
    embed_request,
    generate_request,
    refusal,
    with_defaults,
)
from services.common.engine_proto.responses import EngineStream, embedding

__all__ = ["SAMPLING_DEFAULT_KNOBS", "EngineStream", "Unsupported", "abort_request", "embed_request", "embedding",
           "generate_request", "refusal", "with_defaults"]
