"""NATS glue of the KV-aware router: workers' KV events in, dumps on demand, replica sync.

``KvEventSubscriber`` feeds every worker's event messages (``meshfront.kv.events.<namespace>.>``, fan-out:
each router replica gets all of them; ``meshfront.kv.events.>`` when the router sees several namespaces) to
``KvEventIngest`` and fetches a worker's full block set by NATS request-reply when the ingest asks (a gap, an
unknown parent) and when discovery reports a worker for the first time. The subscription is open before any
dump is requested, so nothing published in between is lost. A worker that leaves discovery is dropped from the
index at once; messages from workers discovery does not know, or sent in another namespace than the one their
card names, are ignored (their dump comes when they register).

``ReplicaSync`` publishes this router's booking changes on ``meshfront.router.lifecycle.<namespace>`` and
applies the other replicas' ones, so every replica holds the same load and a Release that lands on
another replica still frees the booking. Each replica pays for every event the others send, so only
bookings the router marks ``replicate`` go out (a round-robin fleet with no sessions, adapters or
busy threshold shares none: the gateway sends each release back to the replica that booked it), and
with them that request's first token and release, from whichever replica gets those. A booking goes
out at once (two replicas must not both see an idle worker or a missing prefix) while a
first token or a release waits up to ``LAZY_FLUSH_S`` to ride with the next booking or with each
other: until then the other replicas count the request as still in its prefill, or still running,
which only overstates a worker's load for that long.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable

import nats.errors
import orjson
from nats.aio.client import Client as NatsClient

from services.common.discovery import WorkerCard
from services.common.dp_ranks import split_target, target_id
from services.common.kv_events import EVENTS_PREFIX, dump_subject
from services.common.namespace import DEFAULT_NAMESPACE, EVERY_NAMESPACE, DiscoveryFilter, Namespace
from services.common.nats_connection import close_nats, connect_retrying, flush_in_order, stop_if_cancelled
from services.router.core.kv_ingest import KvEventIngest, Verdict
from services.router.core.lifecycle import BOOK, FREE, LifecycleEvent
from services.router.dp_pins import targets_of

log = logging.getLogger(__name__)

LIFECYCLE_SUBJECT = "meshfront.router.lifecycle"  # then the router's namespace
DUMP_TIMEOUT_S = 2.0
DUMP_RETRY_S = 0.5
DUMP_ATTEMPTS = 10
# How long a first token or a release may wait for a booking to carry it to the other replicas (see above).
LAZY_FLUSH_S = 0.1

LagObserver = Callable[[float], None]


class KvEventSubscriber:
    def __init__(self, nats_url: str, ingest: KvEventIngest, is_known: Callable[[str], bool],
                 on_lag: LagObserver | None = None, *, namespaces: DiscoveryFilter = EVERY_NAMESPACE):
        """``namespaces``: the router's discovery filter; one namespace's events are all it is sent when exact."""
        self.nats_url = nats_url
        self.ingest = ingest
        self._is_known = is_known
        self.subscription = namespaces.subjects(EVENTS_PREFIX)
        # worker id -> its namespace (its card's): where its dumps are asked, which events are its own
        self._namespace_of: dict[str, Namespace] = {}
        self._on_lag = on_lag or (lambda _s: None)
        self._nc: NatsClient | None = None
        self._dumping: dict[str, asyncio.Task] = {}  # by target id
        self._targets: dict[str, list[str]] = {}  # worker id -> its target ids, as its card declares them
        self._waiting_for_nats: set[str] = set()
        self._silent: set[str] = set()  # workers whose cards say they publish no KV events (told once each)
        self.ready = asyncio.Event()

    async def start(self) -> None:
        self._nc = nc = await connect_retrying(self.nats_url, "router-kv-events")
        await nc.subscribe(self.subscription, cb=self._on_message)
        await flush_in_order(nc)
        self.ready.set()
        for worker_id in self._waiting_for_nats:
            self._fetch_dump(worker_id)
        self._waiting_for_nats.clear()

    def on_worker_change(self, worker_id: str, card: WorkerCard | None) -> None:
        # A worker with data-parallel ranks is one event stream, index entry and dump per rank, each under the
        # rank's target id (services/common/dp_ranks.py); a worker without ranks is one under its own id.
        targets = self._targets.pop(worker_id, [worker_id])
        if card is None:
            for target in targets:
                task = self._dumping.pop(target, None)
                if task is not None:
                    task.cancel()
                self.ingest.drop_worker(target)
            self._namespace_of.pop(worker_id, None)
            self._silent.discard(worker_id)
            return
        if not card.kv_events:
            # Said, not silent: a kv router over workers that publish nothing routes by its own bookings alone.
            if worker_id not in self._silent and not card.model.is_media:
                self._silent.add(worker_id)
                log.warning("worker %s publishes no KV events (a worker started with --no-kv-events, or a kind without "
                            "a prefix cache): kv routing sees none of its cache or load, only what it routed there",
                            worker_id)
            return  # no events, no dump to ask for
        self._namespace_of[worker_id] = Namespace(card.namespace)
        self._targets[worker_id] = targets_of(card)
        if card.model.is_media:
            return  # no KV cache, no events, no dump to ask for
        for target in self._targets[worker_id]:
            if self.ingest.needs_dump(target):
                self.ingest.begin_sync(target)
                if self._nc is None:
                    self._waiting_for_nats.add(target)
                else:
                    self._fetch_dump(target)

    async def _on_message(self, msg) -> None:
        try:
            data = orjson.loads(msg.data)
            worker_id = data["worker_id"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            log.warning("malformed KV event message on %s", msg.subject)
            return
        if not self._is_known(worker_id) or not self._own(worker_id, msg.subject):
            return
        target = target_id(worker_id, data.get("dp_rank"))
        if target not in self._targets.get(worker_id, (worker_id,)):
            return  # a rank its card does not declare (or a rank-less message from a worker with ranks)
        sent = data.get("published_at_ms")
        if sent:
            self._on_lag(max(0.0, time.time() - sent / 1000.0))
        try:
            verdict = self.ingest.on_message(data)
        except (KeyError, TypeError, ValueError) as e:
            log.warning("bad KV event from %s (%s); resynchronising", target, e)
            verdict = Verdict.RESYNC
            self.ingest.begin_sync(target)
        if verdict is Verdict.RESYNC:
            self._fetch_dump(target)

    def _own(self, worker_id: str, subject: str) -> bool:
        """Whether ``subject`` is in the namespace ``worker_id`` registered in (not another namespace's worker
        that took the same id, seen through a wider subscription)."""
        namespace = self._namespace_of.get(worker_id)
        return namespace is None or subject.startswith(f"{namespace.subject(EVENTS_PREFIX)}.")

    def _fetch_dump(self, target: str) -> None:
        task = self._dumping.get(target)
        if task is not None and not task.done():
            return
        self._dumping[target] = asyncio.create_task(self._dump(target), name=f"kv-dump-{target}")

    async def _dump(self, target: str) -> None:
        worker_id, rank = split_target(target)
        for _ in range(DUMP_ATTEMPTS):
            if not self._is_known(worker_id):
                return
            assert self._nc is not None  # dumps are fetched only once connected (see start)
            try:
                subject = dump_subject(self._namespace_of.get(worker_id, DEFAULT_NAMESPACE), worker_id, rank)
                reply = await self._nc.request(subject, b"", timeout=DUMP_TIMEOUT_S)
                data = orjson.loads(reply.data)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - no responder yet, timeout, garbage: retry
                stop_if_cancelled()
                log.info("KV dump from %s failed (%s); retrying", worker_id, e)
                await asyncio.sleep(DUMP_RETRY_S)
                continue
            self._dumping.pop(target, None)
            verdict = self.ingest.load_dump(target, data["seq"], data["blocks"])
            log.info("KV state of %s loaded: %d blocks as of seq %d", target, len(data["blocks"]), data["seq"])
            if verdict is Verdict.RESYNC:
                self._fetch_dump(target)
            return
        self.ingest.resync_failed(target)
        log.warning("worker %s did not answer KV dump requests; its events will retry", target)

    async def close(self) -> None:
        for task in self._dumping.values():
            task.cancel()
        await close_nats(self._nc)


class ReplicaSync:
    """Shares booking changes between router replicas over NATS (a ``LifecycleListener``)."""

    def __init__(self, nats_url: str, apply: Callable[[LifecycleEvent, bool], None], router_id: str = "",
                 lazy_flush_s: float = LAZY_FLUSH_S, *, namespace: Namespace = DEFAULT_NAMESPACE):
        """``namespace``: the router's own (``--namespace``); its replicas share bookings in it alone."""
        self.nats_url = nats_url
        self.subject = namespace.subject(LIFECYCLE_SUBJECT)
        self.lazy_flush_s = lazy_flush_s
        self.router_id = router_id or f"router-{secrets.token_hex(4)}"
        self._apply = apply
        self._nc: NatsClient | None = None
        self._outbox: list[bytes] = []
        self._flush_task: asyncio.Task | None = None
        self._lazy_flush: asyncio.TimerHandle | None = None
        self._replicated: set[str] = set()  # requests whose bookings every replica holds, until their release
        self.messages_received = 0  # the other replicas' (no echo of our own: see start)

    async def start(self) -> None:
        # no_echo: a replica's own messages would come back to it, costing a one-router mesh as much as a peer.
        self._nc = nc = await connect_retrying(self.nats_url, self.router_id, no_echo=True)
        await nc.subscribe(self.subject, cb=self._on_message)
        await flush_in_order(nc)  # the subscription is live before we publish or report ready

    def on_lifecycle(self, event: LifecycleEvent, remote: bool = False) -> None:
        if not self._shared(event, remote) or remote or self._nc is None:
            return
        self._outbox.append(orjson.dumps(event.to_wire(self.router_id)))
        if event.kind == BOOK:
            self._flush_soon()
        elif self._lazy_flush is None:
            self._lazy_flush = asyncio.get_running_loop().call_later(self.lazy_flush_s, self._flush_soon)

    def _shared(self, event: LifecycleEvent, remote: bool) -> bool:
        """Whether every replica holds ``event``'s request (a booking that is replicated, or one a replica sent;
        a booking replicated once stays so when it is booked again), keeping track of those requests."""
        request_id = event.request_id
        if event.kind == BOOK:
            if not (remote or event.replicate or request_id in self._replicated):
                return False
            self._replicated.add(request_id)
            return True
        if event.kind == FREE:
            if request_id not in self._replicated:
                return False
            self._replicated.discard(request_id)
            return True
        return request_id in self._replicated

    def _flush_soon(self) -> None:
        if self._lazy_flush is not None:
            self._lazy_flush.cancel()
            self._lazy_flush = None
        if self._flush_task is None or self._flush_task.done():
            self._flush_task = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        # Everything of one loop tick in one NATS message: fewer messages under load.
        while self._outbox and self._nc is not None:
            outbox, self._outbox = self._outbox, []
            # NATS away: the other replicas miss these bookings until the workers' own load reports correct them.
            with contextlib.suppress(nats.errors.Error):
                await self._nc.publish(self.subject, b"[" + b",".join(outbox) + b"]")

    async def _on_message(self, msg) -> None:
        self.messages_received += 1
        try:
            items = orjson.loads(msg.data)
        except orjson.JSONDecodeError as e:  # not a replica's: this one's bookings do not change
            log.warning("a message on %s is not JSON (%s); ignored", self.subject, e)
            return
        for item in items:
            try:
                event = LifecycleEvent.from_wire(item)
            except TypeError as e:  # an event missing a field every version sends: said, then skipped
                log.warning("a replica's booking event %r does not decode (%s); ignored", item, e)
                continue
            self._apply(event, True)

    async def close(self) -> None:
        if self._outbox:  # the releases still waiting: the other replicas would hold those bookings forever
            self._flush_soon()
        if self._flush_task is not None:
            await self._flush_task
        await close_nats(self._nc, flush=True)
