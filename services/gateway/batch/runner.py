"""Batches run in the background by the gateway replica that holds the batch's lease; visible from every replica.

The accepting replica writes the batch (``validating``, leased to itself) and runs it at once: it reads the
input file, checks every line (lines.py), and runs the good ones through the gateway's own servicers
(inprocess.py) at the batch priority, at most ``max_concurrency`` lines at a time over all the batches of
this replica, so interactive requests keep their latency. A heartbeat renews the lease every
``PROGRESS_EVERY_S`` and writes ``request_counts`` with it.

A line counts only once its outcome is recorded in NATS (store.py ``LineStore``, create-only, keyed by the
batch and the line): a replica that dies loses only the lines it was running, and the replica that takes the
batch over (every replica sweeps for expired leases every ``sweep_s``; exactly one wins the compare-and-set)
reads the recorded lines and runs the rest. The output and error files are built from the recorded lines,
one line per input line, under ids derived from the batch's, so a batch finalized twice writes them once.

A line the mesh cannot take now (429, 503: busy, restarting, NATS away) is tried again, never failed: a batch
has its whole completion window. Every write is a compare-and-set; one that finds the record changed reads it
again: a cancel (status ``cancelling``) stops new lines, lets the running ones end, and the batch becomes
``cancelled``; another owner means the batch was taken over, and this replica stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from services.common.errors import InvalidRequest, MeshError, NotFound
from services.gateway.batch import state
from services.gateway.batch.files import FileStore
from services.gateway.batch.inprocess import Execute, LineFailed
from services.gateway.batch.lines import Line, Outcome, counts, file_errors, output_files, parse_input
from services.gateway.batch.store import FILE_TTL_S, Entry, LeaseLost, LineStore, RecordStore
from services.gateway.lease_sweep import BucketWrites, QuietSweep, bucket_sequence

log = logging.getLogger(__name__)

LEASE_S = 6.0
SWEEP_S = 2.0
PROGRESS_EVERY_S = 0.5
# Lines one replica runs at once, over all its batches (--batch-max-concurrency).
DEFAULT_CONCURRENCY = 16
# Seconds between tries of a line the mesh could not take, and of a record NATS did not take.
RETRY_S = 0.5
# How long a completed batch's finalizer reads its lines back until every one is there (_recorded).
RECORDED_WAIT_S = 60.0


class _Hold:
    """A running batch's current record; writes are serialized so each compare-and-set expects the latest."""

    def __init__(self, store: RecordStore, entry: Entry, owner: str):
        self.store = store
        self.entry = entry
        self.owner = owner
        self.lost = False
        self.progress: Callable[[], dict[str, int]] | None = None  # the counts the heartbeat writes
        self._lock = asyncio.Lock()

    @property
    def record(self) -> dict[str, Any]:
        return self.entry.record

    async def write(self, **changes: Any) -> None:
        """Writes ``changes``; a record changed by someone else is read again: a cancel is kept (a status this
        write would set before the end gives way to ``cancelling``), another owner is ``LeaseLost``."""
        async with self._lock:
            while True:
                try:
                    self.entry = await self.store.update(self.entry, **changes)
                    return
                except LeaseLost:
                    fresh = await self.store.get(self.record["id"])
                    if fresh is None or fresh.record["owner"] != self.owner:
                        self.lost = True
                        raise
                    if fresh.record["status"] == state.CANCELLING and changes.get("status") in (
                            state.IN_PROGRESS, state.FINALIZING):
                        changes = {k: v for k, v in changes.items() if k not in ("status", "in_progress_at",
                                                                                "finalizing_at", "ending")}
                    self.entry = fresh

    async def refresh(self) -> None:
        """Reads the record again when someone else changed it (the heartbeat's write notices a cancel too)."""
        await self.write()


class BatchRunner:
    def __init__(self, batches: RecordStore, lines: LineStore, files: FileStore, execute: Execute, *,
                 owner: str = "", lease_s: float = LEASE_S, sweep_s: float = SWEEP_S,
                 max_concurrency: int = DEFAULT_CONCURRENCY):
        self.batches = batches
        self.lines = lines
        self.files = files
        self.execute = execute
        self.owner = owner or uuid.uuid4().hex
        self.lease_s = lease_s
        self.sweep_s = sweep_s
        self._slots = asyncio.Semaphore(max_concurrency)
        self._running: dict[str, asyncio.Task] = {}
        self._leases_seen: list[float] = []  # lease_until of the active records the last listing saw

    # ---- the API's operations -------------------------------------------------------------------------

    async def submit(self, tenant: str, key_id: str, input_file_id: str, endpoint: str, window: str,
                     metadata: dict[str, str] | None, *, output_expiry_s: int | None = None) -> dict[str, Any]:
        """Writes a new batch of ``tenant`` (made with the key ``key_id``; "" with --auth off) and starts it
        here; returns its record."""
        try:
            input_file = await self.files.get(tenant, input_file_id)
        except NotFound:
            raise NotFound(f"No such File object: {input_file_id}", param="input_file_id") from None
        if input_file["purpose"] != "batch":
            raise InvalidRequest(f"File {input_file_id} has purpose {input_file['purpose']!r}; a batch's input "
                                 "must be uploaded with purpose 'batch'", param="input_file_id")
        record = state.new_record(tenant=tenant, key_id=key_id, input_file_id=input_file_id, endpoint=endpoint,
                                  window=window, metadata=metadata, now=time.time(), owner=self.owner,
                                  lease_s=self.lease_s, output_expiry_s=output_expiry_s)
        self._start(await self.batches.create(record))
        log.info("batch %s runs here", record["id"])
        return record

    async def get(self, tenant: str, batch_id: str) -> Entry:
        entry = await self.batches.get(batch_id)
        if entry is None or entry.record["tenant"] != tenant:
            raise NotFound(f"No such Batch object: {batch_id}", param="batch_id")
        return entry

    async def list_batches(self, tenant: str) -> list[dict[str, Any]]:
        return [e.record for e in await self.batches.all() if e.record["tenant"] == tenant]

    async def cancel(self, tenant: str, batch_id: str) -> dict[str, Any]:
        """Marks the batch ``cancelling`` (its runner, or the replica that takes it over, finishes it)."""
        while True:
            entry = await self.get(tenant, batch_id)
            changes = state.cancel(entry.record, time.time())
            if not changes:
                return entry.record
            try:
                return (await self.batches.update(entry, **changes)).record
            except LeaseLost:
                continue  # its runner wrote meanwhile (progress): cancel what is there now

    # ---- running a batch ------------------------------------------------------------------------------

    def _start(self, entry: Entry) -> None:
        batch_id = entry.record["id"]
        task = asyncio.create_task(self._run(entry), name=f"batch {batch_id}")
        self._running[batch_id] = task
        task.add_done_callback(lambda _: self._running.pop(batch_id, None))

    async def _run(self, entry: Entry) -> None:
        hold = _Hold(self.batches, entry, self.owner)
        batch_id = entry.record["id"]
        heartbeat = asyncio.create_task(self._heartbeat(hold, asyncio.current_task()))
        try:
            await self._drive(hold, heartbeat)
        except LeaseLost:
            log.info("batch %s: taken over by another replica; stopped here", batch_id)
        except asyncio.CancelledError:
            if not hold.lost:  # this replica is stopping: hand the batch back for another to take over now
                with contextlib.suppress(LeaseLost, MeshError):
                    await asyncio.shield(hold.write(lease_until=0, owner=""))
            raise
        except MeshError as e:  # NATS away for good: the lease lapses and a sweep (maybe this one's) resumes it
            log.warning("batch %s stopped here: %s", batch_id, e.message)
        except Exception:
            log.exception("batch %s failed in the gateway; its lease lapses and it is resumed", batch_id)
        finally:
            heartbeat.cancel()

    async def _drive(self, hold: _Hold, heartbeat: asyncio.Task) -> None:
        r = hold.record
        try:
            data = await self.files.read(r["tenant"], r["input_file_id"])
        except NotFound:  # deleted since the create
            await self._end(hold, heartbeat, state.failed_changes(
                [{"code": "file_not_found", "message": f"The input file {r['input_file_id']} no longer exists.",
                  "param": "input_file_id", "line": None}], time.time()))
            return
        lines = parse_input(data, r["endpoint"])
        errors = file_errors(lines)
        if errors:
            await self._end(hold, heartbeat, state.failed_changes(errors, time.time()))
            return
        done = await self.lines.done(r["id"])
        hold.progress = lambda: counts(lines, done)
        if r["status"] == state.VALIDATING:
            await hold.write(status=state.IN_PROGRESS, in_progress_at=int(time.time()),
                             request_counts=counts(lines, done))
        if hold.record["status"] == state.IN_PROGRESS:
            await self._execute(hold, lines, done)
        await self._finalize(hold, heartbeat, lines, done)

    async def _execute(self, hold: _Hold, lines: list[Line], done: dict[int, Outcome]) -> None:
        """Runs every line not done yet, ``max_concurrency`` at a time (over the replica), until a cancel or
        the window's end; lines running at a cancel end, at the window's end they stop."""
        running: set[asyncio.Task] = set()
        for line in lines:
            if line.error is not None or line.index in done:
                continue
            while not state.ending(hold.record, time.time()):
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(PROGRESS_EVERY_S):
                        await self._slots.acquire()
                    break
            else:
                break
            task = asyncio.create_task(self._line(hold, line, done))
            running.add(task)
            task.add_done_callback(running.discard)
        if running:
            await asyncio.wait(running, timeout=max(0.0, hold.record["expires_at"] - time.time()))
        for task in list(running):
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    async def _line(self, hold: _Hold, line: Line, done: dict[int, Outcome]) -> None:
        """One line: run (tried again while the mesh cannot take it), recorded, then counted."""
        r = hold.record
        try:
            while True:
                try:
                    outcome = await self.execute(r["endpoint"], line.body, r["tenant"], r["key_id"])
                    break
                except LineFailed as e:
                    if hold.lost or state.ending(hold.record, time.time()):
                        return  # never ran: batch_cancelled / batch_expired in the error file
                    log.debug("batch %s line %d waits (%d)", r["id"], line.index, e.status)
                    await asyncio.sleep(RETRY_S)
            while True:
                try:
                    await self.lines.record(r["id"], line.index, outcome)
                    break
                except MeshError as e:  # NATS away: the outcome waits here until it is recorded
                    if hold.lost:
                        return
                    log.debug("batch %s line %d not recorded yet: %s", r["id"], line.index, e.message)
                    await asyncio.sleep(RETRY_S)
            done[line.index] = outcome
        finally:
            self._slots.release()

    async def _finalize(self, hold: _Hold, heartbeat: asyncio.Task, lines: list[Line],
                        known: dict[int, Outcome]) -> None:
        r = hold.record
        final = r.get("ending") or state.ending(r, time.time()) or state.COMPLETED
        if r["status"] != state.FINALIZING and final != state.CANCELLED:
            await hold.write(status=state.FINALIZING, finalizing_at=int(time.time()), ending=final)
            if hold.record["status"] == state.CANCELLING:  # a cancel landed first: it wins
                final = state.CANCELLED
        done = await self._recorded(r, lines, known, complete=final == state.COMPLETED)
        unrun = "batch_cancelled" if final == state.CANCELLED else "batch_expired"
        out, err = output_files(r["id"], lines, done, unrun)
        suffix = r["id"].removeprefix("batch_")
        ttl_s = r["output_expiry_s"] or FILE_TTL_S  # output_expires_after, else the files' own life
        output_id = error_id = None
        if out:
            output_id = (await self.files.put(r["tenant"], f"{r['id']}_output.jsonl", "batch_output", out,
                                              file_id=f"file-{suffix}-output", ttl_s=ttl_s))["id"]
        if err:
            error_id = (await self.files.put(r["tenant"], f"{r['id']}_error.jsonl", "batch_output", err,
                                             file_id=f"file-{suffix}-error", ttl_s=ttl_s))["id"]
        await self._end(hold, heartbeat, state.final_changes(final, time.time(), output_id, error_id,
                                                             counts(lines, done)))
        with contextlib.suppress(MeshError):  # the files hold the lines now; the TTL reclaims them otherwise
            await self.lines.purge(r["id"])
        log.info("batch %s %s: %s", r["id"], final, hold.record["request_counts"])

    async def _recorded(self, r: dict[str, Any], lines: list[Line], known: dict[int, Outcome], *,
                        complete: bool) -> dict[int, Outcome]:
        """Every line's recorded outcome: NATS's (lines earlier owners ran too) and this runner's own.

        A completed batch ran every valid line, and each outcome was recorded before it counted; a read that
        lacks some (a JetStream just restarted from disk answered a watch before its stream was back) is read
        again rather than written into the output as lines that never ran, for up to RECORDED_WAIT_S."""
        deadline = time.monotonic() + RECORDED_WAIT_S
        while True:
            done = {**await self.lines.done(r["id"]), **known}
            missing = sum(1 for line in lines if line.error is None and line.index not in done)
            if not complete or not missing:
                return done
            if time.monotonic() >= deadline:
                log.warning("batch %s: %d completed lines' outcomes are not in NATS; finalized without them",
                            r["id"], missing)
                return done
            log.info("batch %s: %d recorded lines not read back yet; reading again", r["id"], missing)
            await asyncio.sleep(RETRY_S)

    async def _end(self, hold: _Hold, heartbeat: asyncio.Task, changes: dict[str, Any]) -> None:
        """The batch's last write; the heartbeat stops first so that nothing writes after it."""
        heartbeat.cancel()
        await asyncio.gather(heartbeat, return_exceptions=True)
        await hold.write(**changes)

    async def _heartbeat(self, hold: _Hold, runner: asyncio.Task | None) -> None:
        """Renews the lease and writes the counts; a write that finds another owner stops the run."""
        while True:
            await asyncio.sleep(PROGRESS_EVERY_S)
            changes: dict[str, Any] = {"lease_until": time.time() + self.lease_s}
            if hold.progress is not None:
                changes["request_counts"] = hold.progress()
            try:
                await hold.write(**changes)
            except LeaseLost:
                if runner is not None:
                    runner.cancel()
                return
            except MeshError as e:  # NATS away: keep running; the next renewal may get through
                log.warning("batch %s: lease not renewed (%s)", hold.record["id"], e.message)

    # ---- takeover -------------------------------------------------------------------------------------

    async def sweep(self) -> None:
        """Background: takes over batches whose lease expired (their replica died, froze or stopped)."""
        # Sleeps until a write or a lease due, and skips the listing while it could find nothing (lease_sweep.py).
        quiet, writes = QuietSweep(), BucketWrites(self.batches, self.batches.bucket)
        while True:
            await asyncio.sleep(self.sweep_s)
            try:
                await writes.wait(quiet.quiet_for(time.time()))
                sequence = await bucket_sequence(self.batches)
                if quiet.needed(sequence, time.time()):
                    await self.take_over_expired()
                    quiet.listed(sequence, self._leases_seen)
            except MeshError as e:
                log.debug("batch sweep skipped: %s", e.message)

    async def take_over_expired(self) -> list[str]:
        taken = []
        listing = await self.batches.all()
        self._leases_seen = [e.record["lease_until"] for e in listing if e.record["status"] in state.ACTIVE]
        for entry in listing:
            r = entry.record
            if r["status"] not in state.ACTIVE or r["lease_until"] > time.time() or r["id"] in self._running:
                continue
            try:
                entry = await self.batches.update(entry, owner=self.owner, lease_until=time.time() + self.lease_s,
                                                  attempts=r["attempts"] + 1)
            except LeaseLost:
                continue  # another replica took it first
            log.info("batch %s taken over from %s (attempt %d)", r["id"], r["owner"] or "a stopped replica",
                     r["attempts"] + 1)
            self._start(entry)
            taken.append(r["id"])
        return taken

    async def close(self) -> None:
        """Stops the runs here; each hands its batch back (see ``_run``)."""
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
