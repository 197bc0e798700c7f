"""Applies workers' KV event batches to the index, in order, and notices when any went missing.

Wire shape (services/common/kv_events.py; one NATS message per engine tick)::

    {"worker_id": str, "dp_rank": int (only from a worker with ranks), "model": str, "seq": int,
     "published_at_ms": int,
     "events": [{"stored": {"parent_hash": int | None, "blocks": [{"block_hash": int, "tokens_hash": int}]}}
                | {"removed": {"block_hashes": [int]}} | {"cleared": {}}],
     "load": {"active_blocks": int, "waiting": int, "running": int, "total_blocks": int}}

``seq`` counts messages per worker from 1 without holes. A message whose ``seq`` is not the next
one (a gap), or a store whose parent block the index does not know, means the index may be wrong
for that worker: the worker is marked for resynchronisation, events that arrive meanwhile are
buffered, and ``load_dump`` replaces the worker's state with its full block set and replays the
buffered messages newer than the dump. The same state machine serves a worker seen for the first
time: it starts unsynced, so its full state is fetched before its live events count.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from services.common.dp_ranks import target_id
from services.router.core.index import RadixIndex

# Messages buffered per worker while its dump is in flight; beyond this the dump is refetched.
MAX_BUFFERED = 4096


class Verdict(enum.Enum):
    APPLIED = "applied"
    DUPLICATE = "duplicate"  # seq already seen (a redelivery, or older than the loaded dump)
    BUFFERED = "buffered"  # waiting for a dump
    RESYNC = "resync"  # the caller must fetch the worker's dump now


@dataclasses.dataclass
class WorkerLoad:
    """What the worker last said about its own load (refines the router's bookings)."""

    active_blocks: int = 0
    waiting: int = 0
    running: int = 0
    total_blocks: int = 0


@dataclasses.dataclass
class IngestStats:
    messages: int = 0
    events: int = 0
    gaps: int = 0
    unknown_parents: int = 0
    resyncs: int = 0
    dumps_loaded: int = 0


@dataclasses.dataclass
class _WorkerStream:
    last_seq: int = 0
    synced: bool = False
    resync_requested: bool = False
    buffered: list[Mapping[str, Any]] = dataclasses.field(default_factory=list)


class KvEventIngest:
    def __init__(self, index: RadixIndex | None = None):
        self.index = index or RadixIndex()
        self.stats = IngestStats()
        self.loads: dict[str, WorkerLoad] = {}
        # Told (worker id, active blocks) as each load report arrives (the kv policy: KvAware.note_report).
        self.load_listeners: list[Callable[[str, int], None]] = []
        self._streams: dict[str, _WorkerStream] = {}

    # -- live messages -----------------------------------------------------------------------------

    def on_message(self, msg: Mapping[str, Any]) -> Verdict:
        # One data-parallel rank's messages are a stream of their own, as its blocks and load are (a rank's seq
        # counts its own messages): keyed by the rank's target id (services/common/dp_ranks.py).
        worker_id = target_id(msg["worker_id"], msg.get("dp_rank"))
        stream = self._streams.setdefault(worker_id, _WorkerStream())
        self.stats.messages += 1
        self._note_load(worker_id, msg.get("load"))
        if not stream.synced:
            if len(stream.buffered) >= MAX_BUFFERED:
                stream.buffered.clear()
                return self._want_resync(stream, force=True)
            stream.buffered.append(msg)
            return self._want_resync(stream)
        seq = msg["seq"]
        if seq <= stream.last_seq:
            return Verdict.DUPLICATE
        if seq != stream.last_seq + 1:
            self.stats.gaps += 1
            return self._lost_track(stream, msg)
        if not self._apply_events(worker_id, msg["events"]):
            self.stats.unknown_parents += 1
            return self._lost_track(stream, None)
        stream.last_seq = seq
        return Verdict.APPLIED

    def _lost_track(self, stream: _WorkerStream, msg: Mapping[str, Any] | None) -> Verdict:
        stream.synced = False
        stream.buffered = [msg] if msg is not None else []
        return self._want_resync(stream, force=True)

    def _want_resync(self, stream: _WorkerStream, force: bool = False) -> Verdict:
        if stream.resync_requested and not force:
            return Verdict.BUFFERED
        stream.resync_requested = True
        self.stats.resyncs += 1
        return Verdict.RESYNC

    def _note_load(self, worker_id: str, load: Mapping[str, int] | None) -> None:
        if load:
            self.loads[worker_id] = WorkerLoad(load.get("active_blocks", 0), load.get("waiting", 0),
                                               load.get("running", 0), load.get("total_blocks", 0))
            for listener in self.load_listeners:
                listener(worker_id, self.loads[worker_id].active_blocks)

    def _apply_events(self, worker_id: str, events: Iterable[Mapping[str, Any]]) -> bool:
        index = self.index
        for event in events:
            self.stats.events += 1
            if "stored" in event:
                data = event["stored"]
                chain = [(b["block_hash"], b["tokens_hash"]) for b in data["blocks"]]
                if not index.store(worker_id, data.get("parent_hash"), chain):
                    return False
            elif "removed" in event:
                index.remove(worker_id, event["removed"]["block_hashes"])
            elif "cleared" in event:
                index.clear(worker_id)
        return True

    # -- dumps and membership ----------------------------------------------------------------------

    def needs_dump(self, worker_id: str) -> bool:
        """True for a worker the index is not (or no longer) in step with."""
        stream = self._streams.get(worker_id)
        return stream is None or not stream.synced

    def begin_sync(self, worker_id: str) -> None:
        """A new worker: buffer its events until its dump is loaded."""
        stream = self._streams.setdefault(worker_id, _WorkerStream())
        stream.resync_requested = True

    def load_dump(self, worker_id: str, seq: int, blocks: Sequence[Sequence[int]]) -> Verdict:
        """Replaces the worker's state with ``blocks`` = [block_hash, parent_hash | None, local_hash]
        (parents first), as of message ``seq``; then replays newer buffered messages."""
        stream = self._streams.setdefault(worker_id, _WorkerStream())
        index = self.index
        index.clear(worker_id)
        for block_hash, parent_hash, local_hash in blocks:
            index.store(worker_id, parent_hash, ((block_hash, local_hash),))
        self.stats.dumps_loaded += 1
        stream.last_seq = seq
        stream.synced = True
        stream.resync_requested = False
        pending, stream.buffered = sorted(stream.buffered, key=lambda m: m["seq"]), []
        verdict = Verdict.APPLIED
        for msg in pending:
            if msg["seq"] > stream.last_seq:
                verdict = self.on_message_replayed(msg)
                if verdict is Verdict.RESYNC:
                    break
        return verdict

    def on_message_replayed(self, msg: Mapping[str, Any]) -> Verdict:
        self.stats.messages -= 1  # counted when it first arrived
        return self.on_message(msg)

    def resync_failed(self, worker_id: str) -> None:
        """The dump request got no answer; the next message asks again."""
        stream = self._streams.get(worker_id)
        if stream is not None:
            stream.resync_requested = False

    def drop_worker(self, worker_id: str) -> None:
        self._streams.pop(worker_id, None)
        self.loads.pop(worker_id, None)
        self.index.drop_worker(worker_id)
