"""Model files through a real NATS: published content-addressed, fetched into a cache, or read in place."""

from __future__ import annotations

import nats
import pytest

from services.common import model_files as mf

pytestmark = pytest.mark.service


async def _objects(js) -> set[str]:
    store = await js.object_store(mf.BUCKET)
    return {info.name for info in await store.list()}


async def test_publish_is_content_addressed_and_idempotent(nats_url, demo_model_dir):
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        digest = await mf.publish(js, demo_model_dir)
        assert digest == mf.model_files_digest(demo_model_dir)
        first = await _objects(js)
        assert digest in first and len(first) == len(mf.read_stage_files(demo_model_dir)) + 1
        assert await mf.publish(js, demo_model_dir) == digest and await _objects(js) == first
        assert await mf.fetch(js, digest) == mf.read_stage_files(demo_model_dir)
    finally:
        await nc.close()


async def test_a_frontend_without_the_directory_fetches_once_into_its_cache(nats_url, demo_model_dir, tmp_path):
    nc = await nats.connect(nats_url)
    try:
        digest = await mf.publish(nc.jetstream(), demo_model_dir)
    finally:
        await nc.close()
    resolver = mf.ModelFilesResolver(nats_url, tmp_path / "cache")
    try:
        elsewhere = "/models/on/the/worker/host"
        got = await resolver.local_dir(elsewhere, digest)
        assert got == str(tmp_path / "cache" / digest)
        assert mf.model_files_digest(got) == digest
        assert await resolver.local_dir(elsewhere, digest) == got and resolver.peek(elsewhere, digest) == got
        # The worker's own directory, when it is here with the same files, is used as it is.
        assert await resolver.local_dir(str(demo_model_dir), digest) == str(demo_model_dir)
        # A card without published files keeps its directory.
        assert await resolver.local_dir(elsewhere, "") == elsewhere
        with pytest.raises(mf.ModelFilesUnavailable, match="not in the"):
            await resolver.local_dir(elsewhere, "e" * 64)
    finally:
        await resolver.close()
