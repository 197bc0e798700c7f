"""The video job and media stores through a NATS cluster's leader election, and writes retried without being
stored twice (services/common/jetstream_replicas.py ``publish_through_failover``).

The cluster is three real nats-servers; the node killed is the one leading the store's stream, so the write
that follows meets a stream with no leader until the two others elect one (4-9 s). The ack-lost case (the
leader stored a write and died before answering) is a real publish whose answer the test drops."""

from __future__ import annotations

import asyncio
import subprocess
import time

import nats
import pytest
from nats.js.errors import APIError

from services.common.jetstream_replicas import publish_through_failover
from services.gateway.media.store import MediaStore
from services.gateway.videos.job_store import JobStore, LeaseLost
from services.launcher.plan import free_port
from services.launcher.processes import wait_port
from tests.conftest import wait_for

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]


@pytest.fixture
def cluster(nats_bin, tmp_path):
    """Three JetStream nodes routed to each other: {node name: (its client URL, its process)}."""
    ports, routes = [free_port() for _ in range(3)], [free_port() for _ in range(3)]
    urls = [f"nats://127.0.0.1:{p}" for p in routes]
    nodes = {}
    for i in range(3):
        argv = [nats_bin, "-js", "-a", "127.0.0.1", "-p", str(ports[i]), "-sd", str(tmp_path / f"n{i}"), "-n",
                f"n{i}", "--cluster_name", "failover", "--cluster", urls[i],
                "--routes", ",".join(u for u in urls if u != urls[i])]
        nodes[f"n{i}"] = (f"nats://127.0.0.1:{ports[i]}",
                          subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        for port in ports:
            assert wait_port(port, time.monotonic() + 10), "a nats-server did not start"
        yield nodes
    finally:
        for _, proc in nodes.values():
            proc.kill()
            proc.wait(10)


async def kill_leader(cluster, stream: str) -> None:
    """SIGKILLs the node leading ``stream`` (read through a node that stays up)."""
    url = ",".join(u for u, _ in cluster.values())
    nc = await nats.connect(url.split(","))
    try:
        info = await nc.jetstream().stream_info(stream)
    finally:
        await nc.close()
    assert info.config.num_replicas == 3 and info.cluster.leader in cluster
    proc = cluster[info.cluster.leader][1]
    proc.kill()
    proc.wait(10)


def cluster_url(cluster) -> str:
    return ",".join(u for u, _ in cluster.values())


async def test_a_video_job_written_while_its_leader_is_elected_is_stored(cluster):
    store = JobStore(cluster_url(cluster))
    task = asyncio.create_task(store.run())
    try:
        await wait_for(lambda: store.ready, 20, "the job store to open its bucket")
        first = await store.create(_job("video_before"))
        await kill_leader(cluster, f"KV_{store.bucket}")
        created = await store.create(_job("video_during"))  # no leader for some seconds: waited for
        assert (await store.get("video_during")).record == created.record
        updated = await store.update(first, status="completed")
        assert (await store.get("video_before")).record["status"] == "completed"
        with pytest.raises(LeaseLost):  # a lost compare-and-set is still one
            await store.update(first, status="failed")
        assert updated.revision > first.revision
    finally:
        task.cancel()
        await store.close()


async def test_media_stored_while_its_leader_is_elected_is_stored(cluster):
    store = MediaStore(cluster_url(cluster), 60)
    task = asyncio.create_task(store.run())
    try:
        await wait_for(lambda: store.ready, 20, "the media store to open its bucket")
        await kill_leader(cluster, store.stream)
        data = bytes(range(256)) * 5000  # three chunks

        async def chunks():
            yield data

        media_id = await store.put(chunks(), "video/mp4")
        content_type, size, parts = await store.open(media_id)
        assert (content_type, size, b"".join([p async for p in parts])) == ("video/mp4", len(data), data)
    finally:
        task.cancel()
        await store.close()


class AckLost:
    """A JetStream context whose first publish is stored but answered with a timeout (the leader died)."""

    def __init__(self, js):
        self._js = js
        self.publishes = 0

    async def publish(self, *args, **kw):
        self.publishes += 1
        ack = await self._js.publish(*args, **kw)
        if self.publishes == 1:
            raise TimeoutError
        return ack

    def __getattr__(self, name):
        return getattr(self._js, name)


async def test_a_retried_write_is_stored_once(nats_url):
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="ONCE", subjects=["once.>"])
        # A plain publish retried under the same message id: JetStream keeps the first.
        ack = await publish_through_failover(AckLost(js), "ONCE", "once.plain", b"x", timeout_s=2)
        assert ack.seq == 1 and (await js.stream_info("ONCE")).state.messages == 1
        # A compare-and-set whose first try was stored: its retry finds its own write, not a lost race.
        cas = {"Nats-Expected-Last-Subject-Sequence": "0"}
        ack = await publish_through_failover(AckLost(js), "ONCE", "once.cas", b"y", timeout_s=2, headers=cas)
        assert ack.seq == 2 and (await js.stream_info("ONCE")).state.messages == 2
        # One that another writer beat is refused, first try or not.
        with pytest.raises(APIError):
            await publish_through_failover(js, "ONCE", "once.cas", b"z", timeout_s=2, headers=cas)
    finally:
        await nc.close()


def _job(video_id: str) -> dict:
    return {"id": video_id, "status": "in_progress", "owner": "a", "lease_until": time.time() + 60,
            "expires_at": time.time() + 600, "created_at": int(time.time())}
