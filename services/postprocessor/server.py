"""gRPC glue for the postprocessor: proto in, ``Postprocessor``, proto stream out."""

from __future__ import annotations

import grpc

from meshfront.postprocessor.v1 import postprocessor_pb2, postprocessor_pb2_grpc
from services.common.errors import relay
from services.postprocessor.service import Postprocessor


class PostprocessorServicer(postprocessor_pb2_grpc.PostprocessorServiceServicer):
    def __init__(self, postprocessor: Postprocessor):
        self._postprocessor = postprocessor

    async def Generate(self, request: postprocessor_pb2.GenerateRequest, context: grpc.aio.ServicerContext) -> None:
        # A caller's cancel closes the generator, whose cleanup cancels the worker call.
        await relay(self._postprocessor.generate(request), context)
