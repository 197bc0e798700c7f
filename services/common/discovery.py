"""Worker discovery over a NATS JetStream KV bucket with per-key TTL.

A worker writes its card under its id with a message TTL and refreshes it on
a heartbeat; if the process dies the key expires and every watcher sees a
PURGE, like an etcd lease. Services that need the set of workers (gateway,
preprocessor, router) keep a ``WorkerRegistry`` that mirrors the bucket, and
judge liveness themselves too (services/common/liveness.py): a registration
NATS restored after it had expired, a silent worker and a dead worker whose
address a new one took are dropped by every reader.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import nats
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import KeyValueConfig
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from services.common.assembly import cancel_within
from services.common.cards import (
    BOTH,
    CHAT,
    COMPLETIONS,
    DECODE,
    EMBEDDINGS,
    IMAGES,
    KV_RELEASE_BY,
    KV_RELEASE_BY_DECODE,
    KV_RELEASE_BY_PREFILL,
    PREFILL,
    ROLES,
    VIDEOS,
    LoraAdapter,
    MediaLimits,
    ModelCard,
    WorkerCard,
    adapter_of,
)
from services.common.jetstream_replicas import nats_servers, open_or_create
from services.common.kv_watch import FirstValues, key_count, quiet_flow_control
from services.common.liveness import Change, LiveWorkers
from services.common.namespace import EVERY_NAMESPACE, DiscoveryFilter, Namespace, split_worker_key
from services.common.nats_connection import close_nats, connect_retrying, stop_if_cancelled
from services.common.static_model import StaticModel

log = logging.getLogger(__name__)

# The cards moved to services/common/cards.py; every module that imports them from here keeps working.
__all__ = ["BOTH", "BUCKET", "CHAT", "CLUSTER_TTL_S", "COMPLETIONS", "DECODE", "DEFAULT_TTL_S", "EMBEDDINGS", "IMAGES",
           "KV_RELEASE_BY", "KV_RELEASE_BY_DECODE", "KV_RELEASE_BY_PREFILL", "PREFILL", "ROLES", "VIDEOS",
           "LoraAdapter", "MediaLimits", "ModelCard", "Registrar", "WorkerCard", "WorkerRegistry", "adapter_of",
           "discovery_ttl_s", "next_beat_in", "open_bucket"]

# One bucket for every namespace, keys ``<namespace>.<worker_id>`` (services/common/namespace.py).
BUCKET = "meshfront_workers"
DEFAULT_TTL_S = 6.0
# A JetStream cluster elects a new leader for a stream 4-9 s after losing the node that led it, and no card
# can be written meanwhile: given several NATS URLs (a cluster), cards live 20 s, so that losing one node does
# not expire every worker (tests/mesh/test_nats_cluster.py). A SIGKILLed worker then leaves routing after 20 s;
# its requests migrate at once whatever the TTL.
CLUSTER_TTL_S = 20.0
# After a failed heartbeat, the next comes this soon: a card must be renewed as soon as a new leader is elected.
RETRY_S = 1.0


def next_beat_in(period_s: float, now: float) -> float:
    """Seconds to the next multiple of ``period_s`` on the wall clock: every worker's heartbeat goes out at the
    same moments, so each reader (four stages and their replicas watch every card) wakes once per period for
    all of them rather than once per worker, and NATS handles them in one burst. Never more than a period, so
    a card is renewed as often as before whatever its phase."""
    return period_s - now % period_s


def discovery_ttl_s(nats_url: str) -> float:
    """The cards' TTL: longer on a cluster (``--nats-url`` lists several nodes), which readers and workers
    agree on since every process of a mesh is given the same URLs."""
    return CLUSTER_TTL_S if len(nats_servers(nats_url)) > 1 else DEFAULT_TTL_S

async def open_bucket(nc: nats.NATS, ttl_s: float = DEFAULT_TTL_S):
    js = nc.jetstream()
    return await open_or_create(lambda: js.key_value(BUCKET), lambda replicas: js.create_key_value(
        KeyValueConfig(bucket=BUCKET, history=1, limit_marker_ttl=ttl_s, replicas=replicas)))


class Registrar:
    """Keeps one worker's card alive in the bucket until ``close``."""

    def __init__(self, nats_url: str, card: WorkerCard, ttl_s: float | None = None, *,
                 before_first_put: Callable[[nats.js.JetStreamContext], Awaitable[None]] | None = None):
        """``before_first_put`` runs (retried like the put) before the card first goes out: what the
        card points at (the model's files in the Object Store) is there before anyone reads the card."""
        self.nats_url = nats_url
        self.card = card
        self.ttl_s = ttl_s if ttl_s is not None else discovery_ttl_s(nats_url)
        self._before_first_put = before_first_put
        self._task: asyncio.Task | None = None
        self._nc: nats.NATS | None = None
        self.registered = asyncio.Event()
        # Set by ``update``: the next heartbeat goes out now rather than after the period.
        self._changed = asyncio.Event()
        self._published = 0  # cards put so far, so that ``update`` can wait for its own
        self.key = Namespace(card.namespace).worker_key(card.worker_id)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="registrar")

    async def update(self, card: WorkerCard, timeout_s: float = 2.0) -> None:
        """Replaces the card (its LoRA adapters changed) and waits, bounded, until the new one is in the
        bucket: a caller that loaded an adapter answers once routers can see it."""
        self.card = card
        target = self._published + 1
        self._changed.set()
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self._published < target and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)

    async def _run(self) -> None:
        self._nc = await connect_retrying(self.nats_url, f"worker-{self.card.worker_id}")
        js = self._nc.jetstream()
        subject = f"$KV.{BUCKET}.{self.key}"
        ready = False
        while True:
            self._changed.clear()
            try:
                if not ready:
                    await open_bucket(self._nc, self.ttl_s)
                    if self._before_first_put is not None:
                        await self._before_first_put(js)
                        self._before_first_put = None
                    ready = True
                # Each put replaces the previous value (history 1) and restarts its TTL.
                await js.publish(subject, self.card.to_json(), msg_ttl=self.ttl_s)
                self._published += 1
                self.registered.set()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - NATS down or restarting: keep serving, retry soon
                stop_if_cancelled()
                log.warning("registration heartbeat failed: %s", e)
                ready = False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(next_beat_in(self.ttl_s / 3, time.time()) if ready
                                           else min(RETRY_S, self.ttl_s / 3)):
                    await self._changed.wait()

    async def close(self) -> None:
        if self._task:
            await cancel_within([self._task])
        if self._nc is None:
            return
        if self._nc.is_connected:
            # Deregister at once rather than waiting for the TTL; bounded, NATS may be going down too.
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2.0):
                    await (await open_bucket(self._nc, self.ttl_s)).purge(self.key)
        await close_nats(self._nc)


Listener = Callable[[str, WorkerCard | None], None]


class WorkerRegistry:
    """A live mirror of the worker bucket.

    ``workers`` maps worker id to card. Listeners are called with
    ``(worker_id, card)`` on add or change and ``(worker_id, None)`` on removal.
    The mirror keeps its last state while NATS is down, so routing to known
    workers goes on, and resynchronises when NATS returns. What counts as live
    is ``LiveWorkers``'s call, not only the bucket's. ``namespaces`` says whose workers are seen (one
    namespace's keys are all it watches when exact); ``workers`` is keyed by worker id, so ids must be unique
    across the namespaces one registry sees (the default ``<kind>-<8 hex>`` is).
    """

    def __init__(self, nats_url: str, name: str, ttl_s: float | None = None, *,
                 namespaces: DiscoveryFilter = EVERY_NAMESPACE, static: StaticModel | None = None):
        self.nats_url = nats_url
        self.name = name
        self.namespaces = namespaces
        self.static = static  # --static-model: that model's cards read its directory (services/common/static_model.py)
        self.workers: dict[str, WorkerCard] = {}
        self._live = LiveWorkers(ttl_s if ttl_s is not None else discovery_ttl_s(nats_url))
        self._by_model: dict[str, list[WorkerCard]] = {}
        self._listeners: list[Listener] = []
        self._task: asyncio.Task | None = None
        self._nc: nats.NATS | None = None
        self.synced = asyncio.Event()

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def models(self) -> dict[str, list[WorkerCard]]:
        """Live workers by model name; a shared view rebuilt on every change: read it, don't mutate it."""
        return self._by_model

    def model(self, name: str) -> ModelCard | None:
        cards = self._by_model.get(name)
        return cards[0].model if cards else None

    def workers_for(self, model: str) -> list[WorkerCard]:
        return self._by_model.get(model, [])

    def adapter(self, name: str) -> LoraAdapter | None:
        """The LoRA adapter served as ``name`` (None: a base model's name, or unknown)."""
        return adapter_of(name, self._by_model.get(name, ()))


    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"registry-{self.name}")

    def _apply(self, changes: list[Change]) -> None:
        if not changes:
            return
        for worker_id, card in changes:
            if card is None:
                log.info("worker %s left", worker_id)
            else:
                log.info("worker %s serves %s at %s", worker_id, card.model.name, card.address)
        self.workers = self._live.cards()
        # Workers change rarely and every request asks by model: index once per change, not per request.
        by_model: dict[str, list[WorkerCard]] = {}
        for c in self.workers.values():
            by_model.setdefault(c.model.name, []).append(c)
        # A LoRA adapter is served by the workers holding it, under its own name, as vLLM serves one: the
        # requests, the model list and the router look it up like a model. A base model's name wins over
        # an adapter that took the same name (a misconfiguration, logged).
        for c in self.workers.values():
            for adapter in c.model.lora_adapters:
                holders = by_model.setdefault(adapter.name, [])
                if holders and holders[0].model.name == adapter.name:
                    log.error("worker %s names a LoRA adapter %r like a base model; ignoring the adapter",
                              c.worker_id, adapter.name)
                    continue
                holders.append(c)
        self._by_model = by_model
        for worker_id, card in changes:
            for listener in self._listeners:
                listener(worker_id, card)

    async def _run(self) -> None:
        self._nc = await connect_retrying(self.nats_url, self.name)
        while True:
            # A new watch may take a while to hear from everyone: silence counts from its start.
            self._live.restart_silence()
            try:
                reconnects = self._nc.stats["reconnects"]
                bucket = await open_bucket(self._nc)
                first = FirstValues(await key_count(self._nc.jetstream(), BUCKET, self.namespaces.keys))
                watcher = quiet_flow_control(await bucket.watch(self.namespaces.keys))
                try:
                    await self._follow(watcher, reconnects, first)
                finally:
                    with contextlib.suppress(Exception):
                        async with asyncio.timeout(1.0):
                            await watcher.stop()
                # NATS is back, perhaps a new server: watch afresh rather than wait for the old watch's
                # consumer to be found gone (nats-py's ordered consumer takes ~10 s after a restart, longer
                # than the silence a worker may keep).
                log.info("NATS reconnected; watching the worker bucket afresh")
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - NATS outage or a missing bucket: keep the last view, retry
                stop_if_cancelled()
                log.warning("worker watch interrupted (%s); keeping %d known workers", e, len(self.workers))
                await asyncio.sleep(1.0)

    async def _follow(self, watcher: KeyValue.KeyWatcher, reconnects: int, first: FirstValues) -> None:
        """Applies the watch's updates until NATS reconnects; checks for silent workers as it goes. ``synced``
        once the bucket's cards at the watch's start are all applied (``first``: not at nats-py's marker, which
        can come before them)."""
        assert self._nc is not None
        nc, loop = self._nc, asyncio.get_running_loop()
        period = self._live.ttl_s / 3
        next_check = loop.time() + period
        if first.complete:  # an empty bucket
            self.synced.set()
        while nc.stats["reconnects"] == reconnects:
            try:
                entry = await watcher.updates(timeout=period)
            except NatsTimeoutError:
                if first.quiet():
                    self.synced.set()
            else:
                if entry is not None:
                    self._take(entry, handed_over=not first.complete)  # one of the values the watch starts with
                if first.took(entry):
                    self.synced.set()
            if loop.time() >= next_check:
                next_check = loop.time() + period
                if nc.is_connected:
                    self._apply(self._live.expire())
                else:
                    self._live.restart_silence()  # nobody can be heard while NATS is away

    def _take(self, entry: KeyValue.Entry, *, handed_over: bool) -> None:
        namespace, worker_id = split_worker_key(entry.key)
        if not self.namespaces.admits(namespace):
            return  # a prefix filter watches every key (see DiscoveryFilter.keys)
        known = self.workers.get(worker_id)
        if known is not None and known.namespace != namespace:
            log.error("worker id %s is registered in namespaces %s and %s; ignoring it in %s",
                      worker_id, known.namespace, namespace, namespace)
            return
        if entry.operation in (KV_DEL, KV_PURGE) or not entry.value:
            self._apply(self._live.left(worker_id))
            return
        try:
            card = WorkerCard.from_json(entry.value)
        except (TypeError, ValueError, KeyError) as e:
            log.error("bad worker card under %s: %s", entry.key, e)
            return
        if self.static is not None:
            card = self.static.apply(card)
        # The server's timestamp of this heartbeat: a datetime, though nats-py's Entry annotates it int.
        created: Any = entry.created
        written = created.timestamp()
        self._apply(self._live.heard(worker_id, card, written, handed_over=handed_over))

    async def close(self) -> None:
        if self._task:
            await cancel_within([self._task])
        await close_nats(self._nc)
