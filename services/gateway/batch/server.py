"""gRPC glue for OpenAI's Files and Batch APIs: ``FilesService`` and ``BatchesService`` behind Envoy's transcoder.

Each RPC is one of the front door's shapes (services/gateway/front_door.py): the file download streams, the
rest are unary. The caller's tenant is its API key's (services/gateway/auth ``batch_caller``; "" with
``--auth`` off): it sees, reads, deletes and cancels only its own files and batches; anything else is the
404 of an id that does not exist.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import orjson
from google.api import httpbody_pb2
from meshfront.gateway.v1 import batches_pb2_grpc

from services.common.errors import InvalidRequest
from services.gateway import auth
from services.gateway.batch import files as file_objects
from services.gateway.batch import state
from services.gateway.batch.files import FileStore
from services.gateway.batch.runner import BatchRunner
from services.gateway.front_door import JSON, Reply, Started, headers, unary_rpc
from services.gateway.front_door_stream import Streamed, stream_rpc
from services.gateway.media.multipart import Form

# (body, content type) -> the form's parts: services/gateway/media/multipart.py ``parse_form``.
FormParser = Callable[[bytes, str], Form]


def _json(body: Any) -> Reply:
    return Reply(httpbody_pb2.HttpBody(content_type=JSON, data=orjson.dumps(body)))


def _limit(raw: str, default: int, most: int) -> int:
    if raw == "":
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= most:
        raise InvalidRequest(f"'limit' must be an integer from 1 to {most}; got {raw!r}", param="limit")
    return int(raw)


def page(records: list[dict[str, Any]], after: str, limit: int, *, ascending: bool = False) -> dict[str, Any]:
    """OpenAI's list object over ``records`` (each already shown as public), by creation time."""
    ordered = sorted(records, key=lambda r: (r["created"], r["id"]), reverse=not ascending)
    start = 0
    if after:
        ids = [r["id"] for r in ordered]
        if after not in ids:
            raise InvalidRequest(f"'after': no object with id {after!r}", param="after")
        start = ids.index(after) + 1
    data = ordered[start:start + limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": start + limit < len(ordered)}


async def caller(context: grpc.aio.ServicerContext) -> tuple[str, str]:
    """(tenant, key id) of the call: its key's with ``--auth``, ("", "") without."""
    key = await auth.batch_caller(headers(context))
    return (key.tenant, key.key_id) if key is not None else ("", "")


class FilesServicer(batches_pb2_grpc.FilesServiceServicer):
    def __init__(self, files: FileStore, parse_form: FormParser):
        self._files = files
        self._parse_form = parse_form

    async def _upload(self, request: httpbody_pb2.HttpBody, context: grpc.aio.ServicerContext, request_id: str,
                      started: Started) -> Reply:
        tenant, _ = await caller(context)
        purpose, filename, data = file_objects.parse_upload(self._parse_form(request.data, request.content_type))
        return _json(file_objects.public(await self._files.put(tenant, filename, purpose, data)))

    async def _list(self, request, context: grpc.aio.ServicerContext, request_id: str, started: Started) -> Reply:
        tenant, _ = await caller(context)
        limit = _limit(request.limit, 10_000, 10_000)
        if request.order not in ("", "asc", "desc"):
            raise InvalidRequest(f"'order' must be asc or desc; got {request.order!r}", param="order")
        if request.purpose and request.purpose not in file_objects.PURPOSES:
            raise InvalidRequest(f"'purpose' must be one of {', '.join(file_objects.PURPOSES)}; got "
                                 f"{request.purpose!r}", param="purpose")
        records = await self._files.list(tenant, request.purpose)
        body = page(records, request.after, limit, ascending=request.order == "asc")
        body["data"] = [file_objects.public(r) for r in body["data"]]
        return _json(body)

    async def _get(self, request, context: grpc.aio.ServicerContext, request_id: str, started: Started) -> Reply:
        tenant, _ = await caller(context)
        return _json(file_objects.public(await self._files.get(tenant, request.file_id)))

    async def _delete(self, request, context: grpc.aio.ServicerContext, request_id: str, started: Started) -> Reply:
        tenant, _ = await caller(context)
        await self._files.delete(tenant, request.file_id)
        return _json({"id": request.file_id, "object": "file", "deleted": True})

    async def _open(self, request, context: grpc.aio.ServicerContext, request_id: str) -> Streamed:
        tenant, _ = await caller(context)
        return Streamed(await self._files.open(tenant, request.file_id), file_objects.JSONL)

    # Administration, not generation: /metrics does not count these (``counted``).
    UploadFile = unary_rpc(_upload, "file upload", counted=False)
    ListFiles = unary_rpc(_list, "file list", counted=False)
    GetFile = unary_rpc(_get, "file get", counted=False)
    DeleteFile = unary_rpc(_delete, "file delete", counted=False)
    DownloadFileContent = stream_rpc(_open, "file download", counted=False)


class BatchesServicer(batches_pb2_grpc.BatchesServiceServicer):
    def __init__(self, runner: BatchRunner):
        self._runner = runner

    async def _create(self, request: httpbody_pb2.HttpBody, context: grpc.aio.ServicerContext, request_id: str,
                      started: Started) -> Reply:
        tenant, key_id = await caller(context)
        input_file_id, endpoint, window, metadata, output_expiry_s = state.parse_create(request.data)
        record = await self._runner.submit(tenant, key_id, input_file_id, endpoint, window, metadata,
                                           output_expiry_s=output_expiry_s)
        return _json(state.public(record))

    async def _get(self, request, context: grpc.aio.ServicerContext, request_id: str, started: Started) -> Reply:
        tenant, _ = await caller(context)
        return _json(state.public((await self._runner.get(tenant, request.batch_id)).record))

    async def _list(self, request, context: grpc.aio.ServicerContext, request_id: str, started: Started) -> Reply:
        tenant, _ = await caller(context)
        body = page(await self._runner.list_batches(tenant), request.after, _limit(request.limit, 20, 100))
        body["data"] = [state.public(r) for r in body["data"]]
        return _json(body)

    async def _cancel(self, request, context: grpc.aio.ServicerContext, request_id: str, started: Started) -> Reply:
        tenant, _ = await caller(context)
        return _json(state.public(await self._runner.cancel(tenant, request.batch_id)))

    CreateBatch = unary_rpc(_create, "batch create", counted=False)
    GetBatch = unary_rpc(_get, "batch get", counted=False)
    ListBatches = unary_rpc(_list, "batch list", counted=False)
    CancelBatch = unary_rpc(_cancel, "batch cancel", counted=False)
