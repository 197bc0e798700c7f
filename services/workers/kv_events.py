"""Publishes a worker's KV cache changes on NATS for the routers, and answers "what do you hold?".

The engine calls the ``KvEventListener`` methods synchronously as its cache changes. Events of one
event-loop tick leave together in one message (an engine step can store and evict many chains),
numbered ``seq`` = 1, 2, 3 ... per worker so that a router notices a lost message. The message
shape is documented in services/router/core/kv_ingest.py; blocks follow Dynamo's ``KvCacheEvent``
field names (``block_hash`` = the engine's own hash, here the sequence hash; ``tokens_hash`` = the
local hash of the block's tokens, which routers navigate by). The wire format (subjects, message and
event shapes) lives in services/common/kv_events.py, shared with the routers.

A router that lost track (a gap, or it just started) asks on ``meshfront.kv.dump.<namespace>.<worker_id>``
(NATS request-reply, so the worker API needs no new RPC). The publisher mirrors its own events,
so it answers from that mirror: the pending events are flushed first and the reply says which
``seq`` the block set is current as of, so the router can replay later messages on top of it.

Subjects: ``meshfront.kv.events.<namespace>.<model>.<worker_id>`` (the model name with every character that
NATS subjects reserve replaced by ``_``), ``meshfront.kv.dump.<namespace>.<worker_id>``: the worker's own
namespace (``--namespace``, services/common/namespace.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

import nats.errors
import orjson
from nats.aio.client import Client as NatsClient

from services.common.kv_events import (
    DUMP_PREFIX,
    EVENTS_PREFIX,
    StoredBlock,
    cleared_event,
    dump_subject,
    events_subject,
    removed_event,
    stored_event,
    subject_token,
)
from services.common.namespace import DEFAULT_NAMESPACE, Namespace
from services.common.nats_connection import close_nats, connect_retrying

log = logging.getLogger(__name__)

__all__ = ["DUMP_PREFIX", "EVENTS_PREFIX", "BlockMirror", "KvEventPublisher", "dump_subject", "events_subject",
           "subject_token"]
# Events held while NATS is unreachable; past this they are dropped and seq skips one, so every
# router sees a gap and asks for a dump once messages flow again.
MAX_PENDING_EVENTS = 20_000
LOAD_INTERVAL_S = 0.5
# A tick with no events and the load as last published sends nothing until this long after the last message:
# every router and gateway replica receives each worker's messages, so an idle fleet of N workers otherwise
# costs each of them 2N messages a second for nothing. A change still goes out on the next tick.
LOAD_HEARTBEAT_S = 5.0

LoadReader = Callable[[], dict[str, int]]


class BlockMirror:
    """The worker's cached blocks as its own events describe them: hash -> (parent, local hash)."""

    def __init__(self) -> None:
        self._blocks: dict[int, tuple[int | None, int]] = {}

    def stored(self, blocks: Sequence[StoredBlock], parent_hash: int | None) -> None:
        parent = parent_hash
        for b in blocks:
            self._blocks[b.block_hash] = (parent, b.tokens_hash)
            parent = b.block_hash

    def removed(self, block_hashes: Sequence[int]) -> None:
        for h in block_hashes:
            self._blocks.pop(h, None)

    def cleared(self) -> None:
        self._blocks.clear()

    def dump(self) -> list[list[int | None]]:
        """[block_hash, parent_hash, local_hash] with every parent before its children; blocks whose
        parent is gone are left out (no prefix match can reach them)."""
        out: list[list[int | None]] = []
        placed: set[int] = set()
        blocks = self._blocks
        for start in blocks:
            chain = []
            h: int | None = start
            while h is not None and h not in placed and h in blocks:
                chain.append(h)
                h = blocks[h][0]
            if h is not None and h not in placed:
                continue  # an ancestor is missing: orphaned chain
            for node in reversed(chain):
                parent, local = blocks[node]
                out.append([node, parent, local])
                placed.add(node)
        return out

    def __len__(self) -> int:
        return len(self._blocks)


class KvEventPublisher:
    """Implements ``KvEventListener`` (services/common/kv_events.py); ``start`` connects, ``close`` stops."""

    def __init__(self, nats_url: str, worker_id: str, model: str, load: LoadReader | None = None, *,
                 namespace: Namespace = DEFAULT_NAMESPACE, dp_rank: int | None = None, load_pushed: bool = False):
        """``dp_rank``: the data-parallel rank whose engine this publisher speaks for (one publisher per rank,
        each with its own ``seq`` and dump subject: services/common/kv_events.py); None: a worker without ranks.
        ``load_pushed``: the owner calls ``load_changed`` whenever its load moves, so the reader is read only then
        and for the heartbeat; otherwise it is polled every ``LOAD_INTERVAL_S``, which keeps an idle process
        waking twice a second."""
        self.nats_url = nats_url
        self.worker_id = worker_id
        self.dp_rank = dp_rank
        self.model = model
        self.namespace = namespace
        self.subject = events_subject(namespace, model, worker_id)
        self.mirror = BlockMirror()
        self.seq = 0
        self.messages = 0
        self._load = load
        self._load_pushed = load_pushed
        self._load_moved = asyncio.Event()
        self._published_load: dict[str, int] | None = None
        self._published_at = 0.0  # time.monotonic() of the last message
        self._pending: list[dict] = []
        self._flush_scheduled = False
        self._lock = asyncio.Lock()
        self._nc: NatsClient | None = None
        self._tasks: list[asyncio.Task] = []
        self.connected = asyncio.Event()

    # -- KvEventListener ---------------------------------------------------------------------------

    def stored(self, blocks: Sequence[StoredBlock], parent_hash: int | None) -> None:
        self.mirror.stored(blocks, parent_hash)
        self._add(stored_event(blocks, parent_hash))

    def removed(self, block_hashes: Sequence[int]) -> None:
        self.mirror.removed(block_hashes)
        self._add(removed_event(block_hashes))

    def cleared(self) -> None:
        self.mirror.cleared()
        self._add(cleared_event())

    def _add(self, event: dict) -> None:
        if len(self._pending) >= MAX_PENDING_EVENTS:
            self._pending.clear()
            self.seq += 1  # a message nobody will see: routers detect the gap and resync
        self._pending.append(event)
        if not self._flush_scheduled and self._nc is not None:
            self._flush_scheduled = True
            self._tasks.append(asyncio.get_running_loop().create_task(self._flush_soon()))
            self._tasks = [t for t in self._tasks if not t.done()]

    def set_load_reader(self, load: LoadReader) -> None:
        self._load = load

    def load_changed(self) -> None:
        """The owner's load moved (``load_pushed``): it goes out on the next tick, at most ``LOAD_INTERVAL_S``
        after the previous message, as polling would send it."""
        self._load_moved.set()

    # -- transport ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connects in the background (the worker must not wait for NATS to serve)."""
        self._tasks.append(asyncio.create_task(self._run(), name="kv-events"))

    async def _run(self) -> None:
        nc = await connect_retrying(self.nats_url, f"kv-events-{self.worker_id}"
                                    + ("" if self.dp_rank is None else f"-dp{self.dp_rank}"))
        await nc.subscribe(dump_subject(self.namespace, self.worker_id, self.dp_rank), cb=self._answer_dump)
        self._nc = nc
        self.connected.set()
        while True:
            try:
                await self._tick()
            except nats.errors.Error:
                pass  # NATS away: the client reconnects on its own and a later tick publishes
            except Exception:  # a bug (the load reader, an event): said every tick, not taken for NATS away
                log.exception("publishing this worker's KV events and load failed")
            await asyncio.sleep(LOAD_INTERVAL_S)  # the rate bound of load messages, pushed or polled
            if self._load_pushed:
                await self._until_moved_or_heartbeat()

    async def _until_moved_or_heartbeat(self) -> None:
        due = self._published_at + LOAD_HEARTBEAT_S - time.monotonic()
        if due > 0 and not self._load_moved.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(due):
                    await self._load_moved.wait()
        self._load_moved.clear()  # the tick that follows reads the load as it is now

    async def _flush_soon(self) -> None:
        self._flush_scheduled = False
        await self.flush()

    async def flush(self) -> None:
        """Publishes pending events (or just the load when there are none) as the next ``seq``."""
        async with self._lock:
            await self._publish_locked(self._read_load())

    async def _tick(self) -> None:
        """The periodic report: what changed since the last message, or the heartbeat (``LOAD_HEARTBEAT_S``)."""
        async with self._lock:
            load = self._read_load()
            if (self._pending or load != self._published_load
                    or time.monotonic() - self._published_at >= LOAD_HEARTBEAT_S):
                await self._publish_locked(load)

    def _read_load(self) -> dict[str, int] | None:
        return self._load() if self._load is not None else None

    async def _publish_locked(self, load: dict[str, int] | None) -> None:
        if self._nc is None:
            return
        events, self._pending = self._pending, []
        self.seq += 1
        msg = {"worker_id": self.worker_id, "model": self.model, "seq": self.seq,
               "published_at_ms": int(time.time() * 1000), "events": events}
        if self.dp_rank is not None:
            msg["dp_rank"] = self.dp_rank
        if load is not None:
            msg["load"] = load
        await self._nc.publish(self.subject, orjson.dumps(msg))
        self._published_load, self._published_at = load, time.monotonic()
        self.messages += 1

    async def _answer_dump(self, msg) -> None:
        async with self._lock:
            if self._pending:
                await self._publish_locked(self._read_load())
            reply = {"worker_id": self.worker_id, "model": self.model, "seq": self.seq,
                     "blocks": self.mirror.dump()}
            if self.dp_rank is not None:
                reply["dp_rank"] = self.dp_rank
        await msg.respond(orjson.dumps(reply))

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await close_nats(self._nc)
        self._nc = None
