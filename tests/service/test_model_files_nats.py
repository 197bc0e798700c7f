"""Model files through a real NATS: published content-addressed, fetched into a cache, or read in place."""

from __future__ import annotations

import nats
import pytest

from services.common import model_files as mf
from services.common.namespace import Namespace

pytestmark = pytest.mark.service


NS = Namespace("files-test")


async def _objects(js, namespace: Namespace = NS) -> set[str]:
    store = await js.object_store(namespace.bucket(mf.BUCKET))
    return {info.name for info in await store.list()}


async def test_publish_is_content_addressed_and_idempotent(nats_url, demo_model_dir):
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        ref = await mf.publish(js, demo_model_dir, NS)
        digest = mf.model_files_digest(demo_model_dir)
        assert ref == f"files-test/{digest}" == mf.model_files_reference(NS, demo_model_dir)
        first = await _objects(js)
        assert digest in first and len(first) == len(mf.read_stage_files(demo_model_dir)) + 1
        assert await mf.publish(js, demo_model_dir, NS) == ref and await _objects(js) == first
        assert await mf.fetch(js, ref) == mf.read_stage_files(demo_model_dir)
        # Another namespace's store does not have them: a mesh sees only its own files.
        with pytest.raises(mf.ModelFilesUnavailable, match="meshfront_model_files_other"):
            await mf.fetch(js, f"other/{digest}")
    finally:
        await nc.close()


async def test_a_frontend_without_the_directory_fetches_once_into_its_cache(nats_url, demo_model_dir, tmp_path):
    nc = await nats.connect(nats_url)
    try:
        ref = await mf.publish(nc.jetstream(), demo_model_dir, NS)
    finally:
        await nc.close()
    digest = mf.model_files_digest(demo_model_dir)
    resolver = mf.ModelFilesResolver(nats_url, tmp_path / "cache")
    try:
        elsewhere = "/models/on/the/worker/host"
        got = await resolver.local_dir(elsewhere, ref)
        assert got == str(tmp_path / "cache" / digest)
        assert mf.model_files_digest(got) == digest
        assert await resolver.local_dir(elsewhere, ref) == got and resolver.peek(elsewhere, ref) == got
        # The worker's own directory, when it is here with the same files, is used as it is.
        assert await resolver.local_dir(str(demo_model_dir), ref) == str(demo_model_dir)
        # A card without published files keeps its directory.
        assert await resolver.local_dir(elsewhere, "") == elsewhere
        with pytest.raises(mf.ModelFilesUnavailable, match="not in the"):
            await resolver.local_dir(elsewhere, "files-test/" + "e" * 64)
    finally:
        await resolver.close()
