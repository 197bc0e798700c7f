"""gRPC glue for GET /v1/media/{media_id}: ``MediaFilesService.GetMedia`` streams a stored output back.

Each stored chunk goes out as its own HttpBody message, which Envoy's transcoder writes into the one HTTP
body as it comes, so a 50 MB video never sits whole in the gateway or in Envoy. The first message
carries the stored content type (the response's Content-Type). The front door's stream shape
(services/gateway/front_door.py ``stream_rpc``) runs it: unknown or expired ids are a 404 in OpenAI's
shape; a store failure mid-body can only end the transfer (the status is already sent). Downloads are
not requests /metrics counts.
"""

from __future__ import annotations

import grpc
from meshfront.gateway.v1 import media_pb2, media_pb2_grpc

from services.gateway.front_door_stream import Streamed, stream_rpc
from services.gateway.media.store import MediaStore


class MediaFilesServicer(media_pb2_grpc.MediaFilesServiceServicer):
    def __init__(self, store: MediaStore):
        self._store = store

    async def _open(self, request: media_pb2.GetMediaRequest, context: grpc.aio.ServicerContext,
                    request_id: str) -> Streamed:
        content_type, _, chunks = await self._store.open(request.media_id)
        return Streamed(chunks, content_type)

    GetMedia = stream_rpc(_open, "media download", counted=False)
