"""The gateway's stage clients as direct calls on the stage service objects (the all-in-one shape).

They implement the client interface of services/gateway/clients.py on the very objects the stages'
gRPC servers wrap; the seam passes proto messages, plain Python objects in-process.
"""

from __future__ import annotations

import asyncio
import contextlib

from meshfront.router.v1 import router_pb2

from services.postprocessor.service import Postprocessor
from services.preprocessor.service import Preprocessor
from services.router.service import Router


class InProcessPreprocessor:
    def __init__(self, service: Preprocessor):
        self._service = service

    async def preprocess(self, req):
        return await self._service.preprocess(req)

    async def preprocess_embeddings(self, req):
        return await self._service.preprocess_embeddings(req)


class InProcessRouter:
    def __init__(self, service: Router):
        self._service = service

    async def route(self, req):
        return await self._service.route(req)

    async def release(self, req):
        await self._service.release(req)

    async def report_first_token(self, report):
        await self._service.release_batch(router_pb2.ReleaseBatchRequest(first_tokens=[report]))

    async def release_batch(self, req):
        await self._service.release_batch(req)


class InProcessPostprocessor:
    def __init__(self, service: Postprocessor):
        self._service = service

    async def generate(self, req):
        gen = self._service.generate(req)
        try:
            async for resp in gen:
                yield [resp]  # in-process, the postprocessor already merged all that was ready into it
        finally:
            with contextlib.suppress(RuntimeError, asyncio.CancelledError):
                await gen.aclose()
