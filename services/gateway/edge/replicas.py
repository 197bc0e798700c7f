"""Gathers every gateway replica's frontend metrics over NATS for the edge's /metrics.

Envoy sends a scrape of /metrics to any one gateway (least-request balancing). That gateway asks its
peers on ``meshfront.gateway.metrics.<namespace>`` and merges their replies with its own (exposition.py), so a
scraper sees the same coherent set whichever replica answers. Peers announce themselves every
``heartbeat_s`` on ``meshfront.gateway.presence.<namespace>``: a scrape waits for every peer heard from within
``peer_ttl_s`` and no longer than ``wait_s``, and forgets a peer that did not answer (a dead one costs one
scrape the wait, not every scrape until its TTL); a single gateway answers at once. The announcements are
rare (every 10 s) because nothing else needs them: a newcomer is answered at once, a dead peer is forgotten at
its first missed scrape. Without NATS a gateway answers with its own families only. Answers are
zlib-compressed JSON: a model's families are a few KiB, and NATS caps a message at 1 MiB by default. The
namespace is the gateway's ``--namespace`` (services/common/namespace.py): another mesh's gateways on the same
NATS are not this one's replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import zlib

import nats
import orjson
from nats.aio.msg import Msg
from prometheus_client import CollectorRegistry

from services.common.namespace import DEFAULT_NAMESPACE, Namespace
from services.common.nats_connection import close_nats, connect_retrying
from services.gateway.edge.exposition import Snapshot, render, snapshot

log = logging.getLogger(__name__)

GATHER_SUBJECT = "meshfront.gateway.metrics"  # then .<namespace>
PRESENCE_SUBJECT = "meshfront.gateway.presence"  # then .<namespace>
HEARTBEAT_S = 10.0
PEER_TTL_S = 3 * HEARTBEAT_S
# A live peer starved of CPU may answer late; a dead one costs a scrape this much, once.
WAIT_S = 3.0


class ReplicaMetrics:
    def __init__(self, nats_url: str, replica: str, registry: CollectorRegistry, *, heartbeat_s: float = HEARTBEAT_S,
                 peer_ttl_s: float = PEER_TTL_S, wait_s: float = WAIT_S, namespace: Namespace = DEFAULT_NAMESPACE):
        self.replica = replica
        self.gather_subject = namespace.subject(GATHER_SUBJECT)
        self.presence_subject = namespace.subject(PRESENCE_SUBJECT)
        self.heartbeat_s = heartbeat_s
        self.peer_ttl_s = peer_ttl_s
        self.wait_s = wait_s
        self._url = nats_url
        self._registry = registry
        self._nc: nats.NATS | None = None
        self._peers: dict[str, float] = {}  # replica -> when last heard

    async def run(self) -> None:
        """Background: connect, answer peers' gathers, announce ourselves until cancelled."""
        # no_echo: our own announcements and gathers would only come back to be ignored (idle wake-ups).
        nc = await connect_retrying(self._url, f"gateway-metrics-{self.replica}", no_echo=True)
        self._nc = nc
        await nc.subscribe(self.gather_subject, cb=self._answer)
        await nc.subscribe(self.presence_subject, cb=self._heard)
        while True:
            with contextlib.suppress(nats.errors.Error):  # NATS down: the client reconnects on its own
                await nc.publish(self.presence_subject, self.replica.encode())
            await asyncio.sleep(self.heartbeat_s)

    async def close(self) -> None:
        await close_nats(self._nc)
        self._nc = None

    async def _heard(self, msg: Msg) -> None:
        peer = msg.data.decode()
        if peer == self.replica:
            return
        newcomer = peer not in self.live_peers()
        self._peers[peer] = time.monotonic()
        if newcomer and self._nc is not None:
            # Answer a newcomer's first announcement with ours: otherwise it learns of us only at our next
            # heartbeat, and until then its scrapes would hold its own series alone (Envoy sends a new
            # replica requests, and scrapes, before that). Once per newcomer, so no echo storm.
            with contextlib.suppress(nats.errors.Error):
                await self._nc.publish(self.presence_subject, self.replica.encode())

    async def _answer(self, msg: Msg) -> None:
        if msg.data.decode() == self.replica or not msg.reply:  # our own gather: answered locally
            return
        with contextlib.suppress(nats.errors.Error):  # the asker gave up, or NATS is away
            await msg.respond(zlib.compress(orjson.dumps(snapshot(self._registry, self.replica))))

    def live_peers(self) -> set[str]:
        now = time.monotonic()
        return {p for p, seen in self._peers.items() if now - seen < self.peer_ttl_s}

    async def gather(self) -> bytes:
        """The /metrics body: our families and every live peer's that answered within ``wait_s``."""
        snapshots = {self.replica: snapshot(self._registry, self.replica)}
        nc, expected = self._nc, self.live_peers()
        if nc is None or not nc.is_connected or not expected:
            return render(snapshots.values())
        replies: asyncio.Queue[Snapshot] = asyncio.Queue()

        async def collect(msg: Msg) -> None:
            try:
                replies.put_nowait(orjson.loads(zlib.decompress(msg.data)))
            except (zlib.error, orjson.JSONDecodeError) as e:  # that replica's series are left out of this scrape
                log.warning("a gateway replica's metrics snapshot did not decode: %s", e)

        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox, cb=collect)
        try:
            await nc.publish(self.gather_subject, self.replica.encode(), reply=inbox)
            deadline = time.monotonic() + self.wait_s
            while not expected <= snapshots.keys():
                left = deadline - time.monotonic()
                if left <= 0:
                    silent = expected - snapshots.keys()
                    log.warning("metrics: no answer within %.1f s from %s", self.wait_s, ", ".join(sorted(silent)))
                    for peer in silent:  # until it announces itself again
                        self._peers.pop(peer, None)
                    break
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        snap = await replies.get()
                    snapshots[snap["replica"]] = snap
        finally:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        return render(snapshots.values())
