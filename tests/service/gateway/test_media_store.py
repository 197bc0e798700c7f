"""The media store against a real nats-server: streamed put and read back across two stores, exact expiry,
delete, unknown ids, and a many-chunk object read one chunk at a time."""

import asyncio
import os

import pytest

from services.common.errors import NotFound
from services.common.nats_store import StoreUnavailable
from services.gateway.media import store as media_store
from services.gateway.media.store import MediaStore
from tests.conftest import wait_for

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]


async def started(url: str, ttl_s: int = 60) -> tuple[MediaStore, asyncio.Task]:
    store = MediaStore(url, ttl_s)
    task = asyncio.create_task(store.run())
    await wait_for(lambda: store.ready, 10, "the store to open its bucket")
    return store, task


async def stop(*pairs) -> None:
    for store, task in pairs:
        task.cancel()
        await store.close()


async def chunks_of(*parts: bytes):
    for p in parts:
        yield p


async def read_all(store: MediaStore, media_id: str) -> tuple[str, int, bytes]:
    content_type, size, chunks = await store.open(media_id)
    return content_type, size, b"".join([c async for c in chunks])


async def test_put_and_read_back_from_another_store(nats_url):
    a, ta = await started(nats_url)
    b, tb = await started(nats_url)
    try:
        data = os.urandom(3 * media_store.CHUNK + 17)  # several stored chunks, the last one short
        media_id = await a.put(chunks_of(data[:1000], data[1000:]), "image/png")
        assert len(media_id) >= 43 and media_id != await a.put(chunks_of(b"x"), "image/png")
        assert await read_all(b, media_id) == ("image/png", len(data), data)
        empty = await a.put(chunks_of(), "image/png")
        assert await read_all(b, empty) == ("image/png", 0, b"")
    finally:
        await stop((a, ta), (b, tb))


async def test_unknown_deleted_and_malformed_ids_are_not_found(nats_url):
    store, task = await started(nats_url)
    try:
        for media_id in ("A" * 43, "bad id", "../etc", ""):
            with pytest.raises(NotFound):
                await store.open(media_id)
        media_id = await store.put(chunks_of(b"abc"), "image/webp")
        assert await store.delete(media_id) is True
        with pytest.raises(NotFound):
            await store.open(media_id)
        assert await store.delete(media_id) is False
    finally:
        await stop((store, task))


async def test_an_object_is_gone_the_moment_its_ttl_is_over(nats_url):
    store, task = await started(nats_url, ttl_s=1)
    try:
        media_id = await store.put(chunks_of(b"abc"), "image/png")
        assert (await read_all(store, media_id))[2] == b"abc"
        await asyncio.sleep(1.1)
        with pytest.raises(NotFound):
            await store.open(media_id)
    finally:
        await stop((store, task))


async def test_a_long_ttl_object_outlives_a_short_ttl_gateway_sharing_the_bucket(nats_url):
    short, ts = await started(nats_url, ttl_s=1)
    long_, tl = await started(nats_url, ttl_s=60)
    try:
        kept = await long_.put(chunks_of(b"kept"), "image/png")
        gone = await short.put(chunks_of(b"gone"), "image/png")
        await asyncio.sleep(1.2)
        assert (await read_all(short, kept))[2] == b"kept"
        with pytest.raises(NotFound):
            await long_.open(gone)
    finally:
        await stop((short, ts), (long_, tl))


async def test_reading_is_chunk_by_chunk(nats_url):
    """A reader that stops after the first chunk never had the rest fetched: nothing holds the whole object."""
    store, task = await started(nats_url)
    try:
        data = os.urandom(8 * media_store.CHUNK)
        media_id = await store.put(chunks_of(data), "video/mp4")
        _, size, chunks = await store.open(media_id)
        assert size == len(data)
        first = await anext(chunks)
        assert first == data[:media_store.CHUNK]
        await chunks.aclose()
    finally:
        await stop((store, task))


async def test_no_nats_is_a_503_not_a_hang():
    store = MediaStore("nats://127.0.0.1:1", 60, wait_s=0.3)
    task = asyncio.create_task(store.run())
    try:
        with pytest.raises(StoreUnavailable):
            await store.open("A" * 43)
    finally:
        await stop((store, task))
