"""Media sent with a uuid, shared by preprocessor replicas through a real NATS: found from another replica,
bounded in bytes and age, and never a failed request when NATS is away."""

from __future__ import annotations

import asyncio
import time

import pytest
from meshfront.common.v1 import common_pb2

from services.common.errors import InvalidRequest
from services.launcher.plan import free_port
from services.preprocessor.media.limits import MediaLimits
from services.preprocessor.media.resolve import MediaResolver, content_hash
from services.preprocessor.media.uuid_store import CHUNK, SharedUuids
from tests.media_samples import data_url, png

pytestmark = pytest.mark.service


def item(**kw) -> common_pb2.MediaItem:
    return common_pb2.MediaItem(modality=kw.pop("modality", "image"), message_index=0, part_index=0, **kw)


def replica(nats_url: str, *, ttl_s: float = 60.0, store_bytes: int = 64 * 1024 * 1024) -> MediaResolver:
    return MediaResolver(MediaLimits(), shared=SharedUuids(nats_url, ttl_s, store_bytes, connect_s=1.0))


async def test_a_uuid_sent_to_one_replica_is_found_by_another(nats_url):
    a, b = replica(nats_url), replica(nats_url)
    # Over two chunks of noise: the bytes come back whole and in order.
    big = png(700, 700, seed=31)
    assert len(big) > 2 * CHUNK
    small = png(56, 56, seed=32)
    try:
        sent = await a.resolve([item(url=data_url(big), uuid="big"), item(url=data_url(small), uuid="small")])
        got = await b.resolve([item(uuid="big"), item(uuid="small")])
        assert [g.content for g in got] == [big, small]
        assert [g.content_hash for g in got] == [content_hash(big), content_hash(small)]
        assert [g.info for g in got] == [s.info for s in sent]  # measured once, by the replica that decoded it
        with pytest.raises(InvalidRequest, match="names a image, not a video"):
            await b.resolve([item(uuid="big", modality="video")])
        with pytest.raises(InvalidRequest, match="no image was sent with uuid 'never'"):
            await b.resolve([item(uuid="never")])
        # Sent again with other content: the other replica sees the latest.
        other = png(56, 56, seed=33)
        await b.resolve([item(url=data_url(other), uuid="small")])
        assert (await replica_reads(nats_url, "small")).content == other
    finally:
        await a.close()
        await b.close()


async def replica_reads(nats_url: str, uuid: str):
    c = replica(nats_url)
    try:
        return (await c.resolve([item(uuid=uuid)]))[0]
    finally:
        await c.close()


async def test_the_store_drops_the_oldest_for_room_and_forgets_after_its_ttl(nats_url):
    first, second = png(300, 300, seed=41), png(300, 300, seed=42)
    writer = replica(nats_url, ttl_s=2.0, store_bytes=len(first) + len(second) // 2)
    try:
        await writer.resolve([item(url=data_url(first), uuid="first")])
        await writer.resolve([item(url=data_url(second), uuid="second")])  # no room for both: first is dropped
        with pytest.raises(InvalidRequest, match="uuid 'first'"):
            await replica_reads(nats_url, "first")
        assert (await replica_reads(nats_url, "second")).content == second
        deadline = time.monotonic() + 10
        while True:
            try:
                await replica_reads(nats_url, "second")
            except InvalidRequest:
                break  # expired
            assert time.monotonic() < deadline, "the item outlived its TTL"
            await asyncio.sleep(0.2)
    finally:
        await writer.close()


async def test_nats_away_is_a_miss_not_a_failure():
    lone = MediaResolver(MediaLimits(), shared=SharedUuids(f"nats://127.0.0.1:{free_port()}", 60.0, 1 << 20,
                                                           connect_s=0.5))
    try:
        cat = png(56, 56, seed=51)
        sent = await lone.resolve([item(url=data_url(cat), uuid="cat")])  # stored here only
        assert (await lone.resolve([item(uuid="cat")]))[0].content == sent[0].content
        with pytest.raises(InvalidRequest, match="uuid 'dog'"):
            await lone.resolve([item(uuid="dog")])
    finally:
        await lone.close()
