"""gRPC glue for GET /v1/media/{media_id}: ``MediaFilesService.GetMedia`` streams a stored output back.

Each stored chunk goes out as its own HttpBody message, which Envoy's transcoder writes into the one HTTP
body as it comes, so a 50 MB video never sits whole in the gateway or in Envoy. The first message
carries the stored content type (the response's Content-Type). Unknown or expired ids are a 404 in
OpenAI's shape; a store failure mid-body can only end the transfer (the status is already sent).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import grpc
from google.api import httpbody_pb2
from meshfront.gateway.v1 import media_pb2, media_pb2_grpc

from services.common.errors import MeshError
from services.gateway.front_door import OPENAI, unexpected
from services.gateway.media.store import MediaStore


class MediaFilesServicer(media_pb2_grpc.MediaFilesServiceServicer):
    def __init__(self, store: MediaStore):
        self._store = store

    async def GetMedia(self, request: media_pb2.GetMediaRequest,
                       context: grpc.aio.ServicerContext) -> AsyncIterator[httpbody_pb2.HttpBody]:
        try:
            content_type, _, chunks = await self._store.open(request.media_id)
            first = await anext(chunks, b"")
        except MeshError as e:
            err: MeshError = e
        except Exception:  # noqa: BLE001 - a bug still gets OpenAI's shape, and is logged
            err = unexpected("media download", uuid.uuid4().hex)
        else:
            yield httpbody_pb2.HttpBody(content_type=content_type, data=first)
            async for data in chunks:
                yield httpbody_pb2.HttpBody(data=data)
            return
        await OPENAI.abort(context, err)
