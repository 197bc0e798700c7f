"""gRPC glue for the preprocessor: PreprocessorService over ``Preprocessor``."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

import grpc
from meshfront.preprocessor.v1 import preprocessor_pb2, preprocessor_pb2_grpc

from services.common.errors import MeshError
from services.common.grpc_server import GrpcServer
from services.preprocessor.metrics import preprocessor_metrics
from services.preprocessor.service import Preprocessor

T = TypeVar("T")


class PreprocessorServicer(preprocessor_pb2_grpc.PreprocessorServiceServicer):
    def __init__(self, preprocessor: Preprocessor):
        self.preprocessor = preprocessor

    async def Preprocess(self, request: preprocessor_pb2.PreprocessRequest,
                         context: grpc.aio.ServicerContext) -> preprocessor_pb2.PreprocessResponse:
        return await _counted(self.preprocessor.preprocess(request))

    async def PreprocessEmbeddings(self, request: preprocessor_pb2.PreprocessEmbeddingsRequest,
                                   context: grpc.aio.ServicerContext) -> preprocessor_pb2.PreprocessEmbeddingsResponse:
        return await _counted(self.preprocessor.preprocess_embeddings(request))


async def _counted(work: Awaitable[T]) -> T:
    """``work``'s result, counted by outcome; errors propagate to the ErrorInterceptor."""
    metrics, outcome = preprocessor_metrics(), "INTERNAL"
    try:
        with metrics.duration.time():
            response = await work
        outcome = "ok"
        return response
    except MeshError as e:
        outcome = e.reason
        raise
    finally:
        metrics.requests.labels(outcome).inc()


def add_to_server(server: GrpcServer, preprocessor: Preprocessor) -> None:
    preprocessor_pb2_grpc.add_PreprocessorServiceServicer_to_server(PreprocessorServicer(preprocessor), server.server)
