"""The video job store against a real nats-server: a job written by one replica is read by another, every
write is a compare-and-set (of two replicas racing to take a job over exactly one wins), and a job is gone
once deleted or past its expires_at."""

import asyncio
import time

import pytest

from services.gateway.lease_sweep import BucketWrites
from services.gateway.videos.job_store import JobStore, LeaseLost
from tests.conftest import wait_for

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]


async def started(url: str) -> tuple[JobStore, asyncio.Task]:
    store = JobStore(url)
    task = asyncio.create_task(store.run())
    await wait_for(lambda: store.ready, 10, "the job store to open its bucket")
    return store, task


def record(video_id: str, expires_in: float = 60) -> dict:
    return {"id": video_id, "status": "in_progress", "owner": "a", "lease_until": time.time() - 1,
            "expires_at": time.time() + expires_in, "created_at": int(time.time())}


async def test_compare_and_set_across_replicas(nats_url):
    (a, ta), (b, tb) = await started(nats_url), await started(nats_url)
    try:
        created = await a.create(record("video_cas"))
        with pytest.raises(LeaseLost):
            await b.create(record("video_cas"))  # an id is written once
        seen_by_b = await b.get("video_cas")
        assert seen_by_b is not None and seen_by_b.record == created.record
        # Both replicas read the same expired lease and try to take the job over: exactly one wins.
        results = await asyncio.gather(a.update(created, owner="a2"), b.update(seen_by_b, owner="b"),
                                       return_exceptions=True)
        assert sorted(type(r).__name__ for r in results) == ["JobEntry", "LeaseLost"], results
        winner = next(r for r in results if not isinstance(r, Exception))
        latest = await a.get("video_cas")
        assert latest is not None and latest.record["owner"] == winner.record["owner"]
        with pytest.raises(LeaseLost):  # the loser's next write fails too: its revision is stale
            await a.update(created, progress=50)
        assert [e.record["id"] for e in await b.all()] == ["video_cas"]
        await b.delete("video_cas")
        assert await a.get("video_cas") is None
        with pytest.raises(LeaseLost):  # a run of a deleted job cannot write it back
            await a.update(latest, status="completed")
    finally:
        for store, task in ((a, ta), (b, tb)):
            task.cancel()
            await store.close()


async def test_expired_and_unknown_jobs_are_none(nats_url):
    store, task = await started(nats_url)
    try:
        await store.create(record("video_old", expires_in=0.5))
        assert await store.get("video_old") is not None
        await asyncio.sleep(0.6)
        assert await store.get("video_old") is None  # exact: expires_at is checked on read
        for video_id in ("video_nope", "not-a-video", "video_../x", ""):
            assert await store.get(video_id) is None
    finally:
        task.cancel()
        await store.close()


async def test_a_sweep_wakes_on_another_replicas_write_and_sleeps_while_nothing_is_written(nats_url):
    """BucketWrites (services/gateway/lease_sweep.py): what lets an idle gateway's sweeps send nothing."""
    (a, ta), (b, tb) = await started(nats_url), await started(nats_url)
    writes = BucketWrites(a, a.bucket)
    try:
        await writes.wait(0)  # subscribes
        loop = asyncio.get_running_loop()
        started_at = loop.time()
        await writes.wait(0.3)
        assert loop.time() - started_at >= 0.3  # nothing written: it slept the whole timeout
        waiting = asyncio.create_task(writes.wait(30))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        await b.create(record("video_wake"))  # the other replica's write
        await asyncio.wait_for(waiting, 5)
        await b.update(await b.get("video_wake"), progress=10)
        await asyncio.sleep(0.2)
        started_at = loop.time()
        await writes.wait(30)  # a write since the last return: at once
        assert loop.time() - started_at < 5
    finally:
        for store, task in ((a, ta), (b, tb)):
            task.cancel()
            await store.close()
