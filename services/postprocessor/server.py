"""gRPC glue for the postprocessor: proto in, ``Postprocessor``, proto stream out."""

from __future__ import annotations

import logging

import grpc

from meshfront.postprocessor.v1 import postprocessor_pb2, postprocessor_pb2_grpc
from services.common.errors import Internal, MeshError, abort
from services.postprocessor.service import Postprocessor

log = logging.getLogger(__name__)


class PostprocessorServicer(postprocessor_pb2_grpc.PostprocessorServiceServicer):
    def __init__(self, postprocessor: Postprocessor):
        self._postprocessor = postprocessor

    async def Generate(self, request: postprocessor_pb2.GenerateRequest, context: grpc.aio.ServicerContext):
        # When the caller cancels, grpc.aio cancels this task; the CancelledError unwinds through
        # the generator, whose cleanup cancels the worker call.
        responses = self._postprocessor.generate(request)
        try:
            async for response in responses:
                yield response
        except MeshError as e:
            await abort(context, e)
        except Exception:
            # A bug, not a client or worker problem: log it, and tell the client no internals.
            log.exception("postprocessor failed on request %s", request.request.request_id)
            await abort(context, Internal("internal error in the postprocessor"))
        finally:
            await responses.aclose()
