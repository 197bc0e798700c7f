"""OpenAI video jobs: run in the background by the replica that holds the job's lease, visible from every replica.

The accepting replica writes the job (``queued``, its own lease) and runs it at once. While it runs it
renews the lease every third of ``lease_s`` and writes the progress at most every ``PROGRESS_EVERY_S``;
the video goes into the media store chunk by chunk, and the job becomes ``completed`` with its media id
(or ``failed`` with an error). Every write is a compare-and-set (job_store.py): a replica that finds the
record changed under it (taken over, deleted) stops its run.

Every replica sweeps the bucket every ``sweep_s``: a job still queued or in progress whose lease has
expired (its replica was killed, or froze) is taken over by compare-and-set, so exactly one replica wins,
and re-run from the start with the same seed, which gives the same bytes. A replica that stops cleanly
hands its jobs back (lease expired now) so the others take them over at their next sweep.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from services.common.errors import MeshError, NoWorkers, Overloaded
from services.gateway.lease_sweep import BucketWrites, QuietSweep, bucket_sequence
from services.gateway.media.runner import CONTENT_TYPES, MediaBlobs, MediaRunner, VideoRun
from services.gateway.media.video_spec import VideoSpec, media_request
from services.gateway.videos.job_store import JobEntry, JobStore, LeaseLost

log = logging.getLogger(__name__)

LEASE_S = 6.0
SWEEP_S = 2.0
PROGRESS_EVERY_S = 0.5
# Jobs one replica runs at once; a create beyond it is a 503 with Retry-After.
MAX_RUNNING = 32
# How long a job waits (queued) for a worker while every worker is busy, before it fails.
QUEUE_WAIT_S = 120.0
ACTIVE = ("queued", "in_progress")
# What GET /v1/videos/{id} shows; the rest of the record is the gateway's own bookkeeping.
PUBLIC = ("id", "object", "created_at", "status", "progress", "completed_at", "expires_at", "model", "prompt",
          "seconds", "size", "error", "remixed_from_video_id")


def public(record: dict[str, Any]) -> dict[str, Any]:
    return {k: record[k] for k in PUBLIC}


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


class _Lease:
    """One running job's current record; writes are serialized so each CAS expects the latest revision."""

    def __init__(self, store: JobStore, entry: JobEntry):
        self.store = store
        self.entry = entry
        self.lost = False
        self._lock = asyncio.Lock()

    async def write(self, **changes: Any) -> None:
        async with self._lock:
            try:
                self.entry = await self.store.update(self.entry, **changes)
            except LeaseLost:
                self.lost = True
                raise


class VideoJobs:
    def __init__(self, store: JobStore, blobs: MediaBlobs, media: MediaRunner, ttl_s: int, owner: str = "", *,
                 lease_s: float = LEASE_S, sweep_s: float = SWEEP_S):
        self.store = store
        self.blobs = blobs
        self.media = media
        self.ttl_s = ttl_s
        self.owner = owner or uuid.uuid4().hex
        self.lease_s = lease_s
        self.sweep_s = sweep_s
        self._running: dict[str, asyncio.Task] = {}
        self._leases_seen: list[float] = []  # lease_until of the active records the last listing saw

    async def submit(self, spec: VideoSpec) -> dict[str, Any]:
        """Writes a new job and starts it here; returns its record."""
        if len(self._running) >= MAX_RUNNING:
            raise Overloaded(f"this gateway runs {MAX_RUNNING} video jobs already; try again")
        now = time.time()
        record: dict[str, Any] = {
            "id": f"video_{secrets.token_urlsafe(24)}", "object": "video", "created_at": int(now),
            "status": "queued", "progress": 0, "completed_at": None, "expires_at": int(now) + self.ttl_s,
            "model": spec.model, "prompt": spec.prompt, "seconds": f"{spec.seconds:g}", "size": spec.size,
            "error": None, "remixed_from_video_id": None,
            "spec": {**spec.to_record(), "input_image": ""}, "input_media_id": None, "media_id": None,
            "content_type": CONTENT_TYPES[spec.output_format], "owner": self.owner,
            "lease_until": now + self.lease_s, "attempts": 1,
            "created": now,  # created_at to the microsecond: the list's order among jobs of one second
        }
        if spec.input_image:  # kept in the object store: a KV record stays small
            record["input_media_id"] = await self.blobs.put(_one(spec.input_image), "application/octet-stream",
                                                            self.ttl_s)
        self._start(await self.store.create(record))
        log.info("video job %s runs here", record["id"])
        return record

    def _start(self, entry: JobEntry) -> None:
        video_id = entry.record["id"]
        task = asyncio.create_task(self._run(entry), name=f"video-job {video_id}")
        self._running[video_id] = task
        task.add_done_callback(lambda _: self._running.pop(video_id, None))

    def _remaining_ttl(self, record: dict[str, Any]) -> int:
        return max(1, math.ceil(record["expires_at"] - time.time()))

    async def _spec(self, record: dict[str, Any]) -> VideoSpec:
        spec = VideoSpec.from_record(record["spec"])
        if record["input_media_id"] is None:
            return spec
        _, _, chunks = await self.blobs.open(record["input_media_id"])
        return dataclasses.replace(spec, input_image=b"".join([c async for c in chunks]))

    async def _run(self, entry: JobEntry) -> None:
        lease = _Lease(self.store, entry)
        renew = asyncio.create_task(self._renew(lease, asyncio.current_task()))
        video_id = entry.record["id"]
        try:
            media_id = await self._generate(lease)
            try:
                await lease.write(status="completed", progress=100, completed_at=int(time.time()),
                                  media_id=media_id, lease_until=0)
            except LeaseLost:
                await self.blobs.delete(media_id)  # deleted (or taken over) meanwhile: the video is nobody's
                raise
            log.info("video job %s completed", video_id)
        except LeaseLost:
            log.info("video job %s: the record changed under this replica (taken over or deleted); stopped", video_id)
        except MeshError as e:
            log.warning("video job %s failed: %s", video_id, e.message)
            with contextlib.suppress(LeaseLost, MeshError):
                await lease.write(status="failed", lease_until=0,
                                  error={"code": e.reason.lower(), "message": e.message})
        except asyncio.CancelledError:
            if not lease.lost:  # this replica is stopping: hand the job back for another to take over now
                with contextlib.suppress(LeaseLost, MeshError):
                    await asyncio.shield(lease.write(lease_until=0, owner=""))
            raise
        except Exception:  # a bug: the job fails with fixed text, the traceback goes to the log
            log.exception("video job %s failed", video_id)
            with contextlib.suppress(LeaseLost, MeshError):
                await lease.write(status="failed", lease_until=0,
                                  error={"code": "internal_error", "message": "internal error in the gateway"})
        finally:
            renew.cancel()

    async def _generate(self, lease: _Lease) -> str:
        """Runs the job's generation (waiting while every worker is busy); returns the video's media id."""
        record = lease.entry.record
        spec = await self._spec(record)
        deadline = time.monotonic() + QUEUE_WAIT_S
        while True:
            run = VideoRun(self.media.run(media_request(spec, f"{record['id']}-{record['attempts']}")))
            try:
                last = 0.0
                async for step, total in run.progress():
                    if lease.entry.record["status"] == "queued":
                        await lease.write(status="in_progress", progress=0)
                    if time.monotonic() - last >= PROGRESS_EVERY_S and total:
                        last = time.monotonic()
                        await lease.write(progress=min(99, 100 * step // total))
                return await self.blobs.put(run.chunks(), record["content_type"], self._remaining_ttl(record))
            except (Overloaded, NoWorkers) as e:
                if lease.entry.record["status"] != "queued" or time.monotonic() > deadline:
                    raise
                log.info("video job %s waits for a worker (%s)", record["id"], e.message)
                await asyncio.sleep(1.0)
            finally:
                await run.aclose()

    async def _renew(self, lease: _Lease, runner: asyncio.Task | None) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                await lease.write(lease_until=time.time() + self.lease_s)
            except LeaseLost:
                if runner is not None:
                    runner.cancel()
                return
            except MeshError as e:  # NATS away: keep running; the next renewal may get through
                log.warning("video job %s: lease not renewed (%s)", lease.entry.record["id"], e.message)

    async def sweep(self) -> None:
        """Background: takes over jobs whose lease expired (their replica died or stopped)."""
        # Sleeps until a write or a lease due, and skips the listing while it could find nothing (lease_sweep.py).
        quiet, writes = QuietSweep(), BucketWrites(self.store, self.store.bucket)
        while True:
            await asyncio.sleep(self.sweep_s)
            try:
                await writes.wait(quiet.quiet_for(time.time()))
                sequence = await bucket_sequence(self.store)
                if quiet.needed(sequence, time.time()):
                    await self.take_over_expired()
                    quiet.listed(sequence, self._leases_seen)
            except MeshError as e:
                log.debug("video job sweep skipped: %s", e.message)

    async def take_over_expired(self) -> list[str]:
        taken = []
        listing = await self.store.all()
        self._leases_seen = [e.record["lease_until"] for e in listing if e.record["status"] in ACTIVE]
        for entry in listing:
            r = entry.record
            if r["status"] not in ACTIVE or r["lease_until"] > time.time() or r["id"] in self._running:
                continue
            if len(self._running) >= MAX_RUNNING:
                break
            try:
                entry = await self.store.update(entry, owner=self.owner, lease_until=time.time() + self.lease_s,
                                                attempts=r["attempts"] + 1, status="queued", progress=0)
            except LeaseLost:
                continue  # another replica took it first
            log.info("video job %s taken over from %s (attempt %d)", r["id"], r["owner"] or "a stopped replica",
                     r["attempts"] + 1)
            self._start(entry)
            taken.append(r["id"])
        return taken

    async def delete(self, video_id: str) -> bool:
        """Forgets a job and its video; a run of it here stops. False when there was none."""
        entry = await self.store.get(video_id)
        if entry is None:
            return False
        await self.store.delete(video_id)
        task = self._running.pop(video_id, None)
        if task is not None:
            task.cancel()
        for media_id in (entry.record["media_id"], entry.record["input_media_id"]):
            if media_id is not None:
                await self.blobs.delete(media_id)
        return True

    async def close(self) -> None:
        """Stops the runs here; each hands its job back (see ``_run``)."""
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
