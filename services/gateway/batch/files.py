"""OpenAI's file objects, each a tenant's: the record in a KV bucket, the bytes in the Object Store (store.py).

A file is the caller's tenant's (the tenant of its API key, "" while keys are off): every read, list and
delete is scoped to it, and another tenant's file is a 404 exactly like one that does not exist. Uploads take
``purpose: batch`` (a batch's input); a batch writes its answers as ``batch_output`` files of its tenant.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from services.common.errors import InvalidRequest, NotFound
from services.common.namespace import DEFAULT_NAMESPACE, Namespace
from services.gateway.batch.store import FILE_TTL_S, FILES, FileContents, RecordStore
from services.gateway.media.multipart import Form

UPLOAD_PURPOSES = ("batch",)
PURPOSES = ("batch", "batch_output")
JSONL = "application/jsonl"
PUBLIC = ("id", "object", "bytes", "created_at", "expires_at", "filename", "purpose", "status", "status_details")
_ID = re.compile(r"^file-[A-Za-z0-9_-]{1,80}$")
MAX_FILENAME = 255


def valid_id(file_id: str) -> bool:
    return bool(_ID.match(file_id))


def public(record: dict[str, Any]) -> dict[str, Any]:
    return {k: record[k] for k in PUBLIC}


def parse_upload(form: Form) -> tuple[str, str, bytes]:
    """POST /v1/files (multipart, as the openai SDK sends it): (purpose, filename, bytes), or a 400."""
    purpose = form.text("purpose")
    if purpose is None:
        raise InvalidRequest("'purpose' is required", param="purpose")
    if purpose not in UPLOAD_PURPOSES:
        raise InvalidRequest(f"'purpose' must be one of {', '.join(UPLOAD_PURPOSES)} here; got {purpose!r}",
                             param="purpose")
    parts = form.all("file")
    if len(parts) != 1 or parts[0].filename is None:
        raise InvalidRequest("'file' is required: one file part", param="file")
    unknown = sorted(form.names() - {"purpose", "file"})
    if unknown:
        raise InvalidRequest(f"Unsupported parameter(s): '{unknown[0]}'", param=unknown[0])
    filename = parts[0].filename or "upload.jsonl"
    if len(filename) > MAX_FILENAME:
        raise InvalidRequest(f"the file's name is longer than {MAX_FILENAME} characters", param="file")
    return purpose, filename, parts[0].data


def _not_found(file_id: str) -> NotFound:
    return NotFound(f"No such File object: {file_id}", param="file_id")


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


class FileStore:
    def __init__(self, nats_url: str, *, namespace: Namespace = DEFAULT_NAMESPACE, wait_s: float = 5.0):
        self.records = RecordStore(nats_url, FILES, valid_id, wait_s=wait_s, namespace=namespace)
        self.contents = FileContents(nats_url, wait_s=wait_s, namespace=namespace)

    async def run(self) -> None:
        await self.records.run()
        await self.contents.run()

    async def close(self) -> None:
        await self.records.close()
        await self.contents.close()

    async def put(self, tenant: str, filename: str, purpose: str, data: bytes, file_id: str = "",
                  ttl_s: int = FILE_TTL_S) -> dict[str, Any]:
        """Stores a file of ``tenant`` for ``ttl_s``; ``file_id`` given: that id, replacing what it held (a
        batch's output)."""
        media_id = await self.contents.put(_one(data), JSONL, ttl_s)
        now = time.time()
        record = {"id": file_id or f"file-{secrets.token_hex(12)}", "object": "file", "bytes": len(data),
                  "created_at": int(now), "expires_at": int(now) + ttl_s, "filename": filename,
                  "purpose": purpose, "status": "processed", "status_details": None, "tenant": tenant,
                  "media_id": media_id, "created": now}
        if file_id:
            old = await self.records.get(file_id)
            await self.records.put(record)
            if old is not None:
                await self.contents.delete(old.record["media_id"])
        else:
            await self.records.create(record)
        return record

    async def get(self, tenant: str, file_id: str) -> dict[str, Any]:
        """The file's record, or a 404 (unknown, deleted, expired, or another tenant's)."""
        entry = await self.records.get(file_id)
        if entry is None or entry.record["tenant"] != tenant or entry.record["expires_at"] <= time.time():
            raise _not_found(file_id)
        return entry.record

    async def open(self, tenant: str, file_id: str) -> AsyncGenerator[bytes, None]:
        record = await self.get(tenant, file_id)
        _, _, chunks = await self.contents.open(record["media_id"])
        return chunks

    async def read(self, tenant: str, file_id: str) -> bytes:
        return b"".join([c async for c in await self.open(tenant, file_id)])

    async def list(self, tenant: str, purpose: str = "") -> list[dict[str, Any]]:
        now = time.time()
        return [e.record for e in await self.records.all()
                if e.record["tenant"] == tenant and e.record["expires_at"] > now
                and (not purpose or e.record["purpose"] == purpose)]

    async def delete(self, tenant: str, file_id: str) -> None:
        record = await self.get(tenant, file_id)
        await self.records.delete(file_id)
        await self.contents.delete(record["media_id"])
