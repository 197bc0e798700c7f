"""gRPC glue for the postprocessor: proto in, ``Postprocessor``, proto stream out."""

from __future__ import annotations

import grpc
from meshfront.postprocessor.v1 import postprocessor_pb2, postprocessor_pb2_grpc

from services.common.errors import relay
from services.common.mux_session import MuxSession, MuxSessions
from services.postprocessor.service import Postprocessor


class PostprocessorServicer(postprocessor_pb2_grpc.PostprocessorServiceServicer):
    def __init__(self, postprocessor: Postprocessor):
        self._postprocessor = postprocessor
        self.sessions = MuxSessions()

    async def Generate(self, request: postprocessor_pb2.GenerateRequest, context: grpc.aio.ServicerContext) -> None:
        # A caller's cancel closes the generator, whose cleanup cancels the worker call.
        await relay(self._postprocessor.generate(request), context)

    async def GenerateStream(self, request_iterator, context: grpc.aio.ServicerContext) -> None:
        # One per gateway and replica: every response that is ready, across requests, in one message.
        # The gateway going away cancels this task, and the session closes every request's generator.
        session = MuxSession(self._postprocessor.generate, context.write, postprocessor_pb2.GenerateStreamResponse,
                             "postprocessor.GenerateStream")
        await self.sessions.serve(session, request_iterator)
