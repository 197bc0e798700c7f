"""One attached engine: its health checks, its card in NATS while healthy, its KV events and load on our subjects.

While the engine answers HealthCheck as healthy, the registrar probes it (model and server info, loads), keeps its
card alive with ``Registrar`` (the same TTL and heartbeat as a worker of ours), relays SubscribeKvEvents through
``BlockHashTranslator`` (our block hashes from the engine's token ids, what the preprocessor computes for a prompt)
into ``KvEventPublisher``, with the load record each batch carries riding on those messages. A failed check removes
the card at once and stops the relays; the next healthy one probes and registers it again under the same id.

At rest the engine's servicer is woken only by what must be asked: a health check each half of the TTL (its
``engine.errored`` is seen by nothing else) and its own relay's tick. GetLoads is read once at registration (the
KV capacity) and polled only for a servicer whose stream carries no load record (an older servicer's batches, or
KV events turned off); each such unary call costs the servicer's process about 2 ms of CPU. A stream that
breaks as the engine goes away brings the next health check forward.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import grpc
from smg_grpc_proto.generated import common_pb2

from services.common import model_files
from services.common.assembly import cancel_within
from services.common.discovery import Registrar, discovery_ttl_s
from services.common.namespace import Namespace
from services.workers.attach import convert
from services.workers.attach.core import (
    HEALTHY,
    SLOW,
    UNHEALTHY,
    AttachSettings,
    CannotAttach,
    EngineLoad,
    Health,
    card_for,
    load_report,
)
from services.workers.engine_kv import BlockHashTranslator
from services.workers.kv_events import KvEventPublisher

log = logging.getLogger(__name__)

LOADS_EVERY_S = 1.0
RESUBSCRIBE_AFTER_S = 1.0
# An engine that refuses SubscribeKvEvents (KV events off) refuses it until it restarts: asked again rarely.
RESUBSCRIBE_REFUSED_S = 30.0


class EngineLink:
    def __init__(self, address: str, settings: AttachSettings, nats_url: str, *, check_every_s: float | None = None):
        self.address = address
        self.settings = settings
        self.nats_url = nats_url
        self.protocol = convert.PROTOCOLS[settings.protocol]
        # A check each half of the TTL: an engine found unhealthy leaves before its card would expire (the interval
        # plus the check's 2 s deadline is under the TTL), and one whose process is gone sooner (its KV-event stream
        # breaks). Each check costs the servicer about 1 ms of CPU: a third of the TTL cost half as much again.
        self.check_every_s = check_every_s if check_every_s is not None else discovery_ttl_s(nats_url) / 2
        self.health = Health()
        self.registrar: Registrar | None = None
        self.publisher: KvEventPublisher | None = None
        self._load: EngineLoad | None = None
        self._block_size = 0
        self._relays: list[asyncio.Task] = []
        self._poller: asyncio.Task | None = None  # GetLoads, only while the stream carries no load record
        self._check_now = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._channel: grpc.aio.Channel | None = None

    async def start(self) -> None:
        self._channel = grpc.aio.insecure_channel(self.address)
        self._task = asyncio.create_task(self._run(), name=f"attach-{self.address}")

    async def close(self) -> None:
        if self._task is not None:
            await cancel_within([self._task])
        await self._deregister()
        if self._channel is not None:
            await self._channel.close()

    async def _run(self) -> None:
        stub = self.protocol.stub(self._channel)
        while True:
            change = self.health.observe(await self._healthy(stub))
            if change == "register":
                try:
                    await self._register(stub)
                except (CannotAttach, grpc.aio.AioRpcError) as e:
                    log.error("not registering the engine at %s: %s", self.address, _reason(e))
                    self.health.registered = False  # probed again on the next check
            elif change == "deregister":
                log.warning("the engine at %s failed its health check; deregistering it", self.address)
                await self._deregister()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.check_every_s):
                    await self._check_now.wait()
            self._check_now.clear()

    async def _healthy(self, stub: Any) -> str:
        try:
            answer = await stub.HealthCheck(self.protocol.messages.HealthCheckRequest(),
                                            timeout=min(2.0, self.check_every_s))
        except grpc.aio.AioRpcError as e:
            if self.health.registered:
                log.info("health check of %s failed: %s", self.address, _reason(e))
            return SLOW if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED else UNHEALTHY
        return HEALTHY if answer.healthy else UNHEALTHY

    async def _register(self, stub: Any) -> None:
        m = self.protocol.messages
        model = await stub.GetModelInfo(m.GetModelInfoRequest(), timeout=5.0)
        server = await stub.GetServerInfo(m.GetServerInfoRequest(), timeout=5.0)
        info = convert.engine_info(self.settings.protocol, model, server)
        self._load = await self._read_loads(stub)
        block_size = self.settings.block_size or info.block_size
        total_blocks = self._load.total_tokens // block_size if self._load is not None and block_size > 0 else 0
        card = card_for(self.settings, self.address, info, total_kv_blocks=total_blocks)
        self._block_size = card.model.block_size
        scope = Namespace(card.namespace)
        self.publisher = KvEventPublisher(self.nats_url, card.worker_id, card.model.name, load=self._report,
                                          namespace=scope, load_pushed=True)
        await self.publisher.start()
        translator = BlockHashTranslator(self.publisher, self._block_size)
        self._relays = [asyncio.create_task(self._relay_kv(stub, translator), name=f"kv-{self.address}")]

        async def publish_files(js: Any) -> None:
            await model_files.publish(js, card.model.model_dir, scope)

        self.registrar = Registrar(self.nats_url, card, before_first_put=publish_files)
        await self.registrar.start()
        log.info("registered %s (%s, %s) for model %s: context %d, block size %d, %d KV blocks", card.worker_id,
                 self.address, self.settings.protocol, card.model.name, card.model.context_length,
                 card.model.block_size, card.total_kv_blocks)

    async def _deregister(self) -> None:
        await cancel_within(self._relays)
        self._relays = []
        self._poll_loads(None)
        if self.registrar is not None:
            await self.registrar.close()
            self.registrar = None
        if self.publisher is not None:
            await self.publisher.close()
            self.publisher = None

    def _report(self) -> dict[str, int]:
        load = self._load or EngineLoad(running=0, waiting=0, token_usage=0.0)
        return load_report(load, self._block_size)

    async def _read_loads(self, stub: Any) -> EngineLoad | None:
        if not self.protocol.has_loads:
            return None
        return convert.loads(await stub.GetLoads(self.protocol.messages.GetLoadsRequest(), timeout=5.0))

    def _set_load(self, load: EngineLoad | None) -> None:
        if load is not None and load != self._load:
            self._load = load
            if self.publisher is not None:
                self.publisher.load_changed()

    def _poll_loads(self, stub: Any | None) -> None:
        """Polls GetLoads with ``stub`` (an engine that has it) while the stream carries no load record; None
        stops polling."""
        if stub is None or not self.protocol.has_loads:
            if self._poller is not None:
                self._poller.cancel()  # between two awaits of its own: nothing of it is left half done
                self._poller = None
        elif self._poller is None:
            self._poller = asyncio.create_task(self._polling(stub), name=f"loads-{self.address}")

    async def _polling(self, stub: Any) -> None:
        while True:
            await asyncio.sleep(LOADS_EVERY_S)
            with contextlib.suppress(grpc.aio.AioRpcError):  # the health check judges the engine, not this
                self._set_load(await self._read_loads(stub))

    async def _relay_kv(self, stub: Any, translator: BlockHashTranslator) -> None:
        """The engine's KV events for as long as it is registered. A new subscription starts from the engine's
        current state without its earlier blocks, and a gap in its sequence loses some: either way the routers
        are told the cache was cleared rather than left with blocks that may be gone."""
        relayed = False  # whether blocks were relayed since the routers were last told the cache was cleared
        while True:
            last = 0
            try:
                request = common_pb2.SubscribeKvEventsRequest(load_records_before_first_batch=True)
                if relayed:
                    translator.cleared()
                    relayed = False
                async for batch in stub.SubscribeKvEvents(request):
                    seq = batch.sequence_number
                    total = self._load.total_tokens if self._load is not None else 0
                    load = convert.batch_load(batch, total)
                    self._set_load(load)
                    # A servicer that stamps its batches stamps every one; one that does not is polled instead.
                    self._poll_loads(stub if load is None else None)
                    if not batch.events:
                        continue  # a load record (it repeats the last sequence)
                    if last and seq > last + 1 and not batch.HasField("snapshot"):
                        log.warning("KV events of %s skipped %d batch(es); clearing its blocks", self.address,
                                    seq - last - 1)
                        translator.cleared()
                    last = max(last, seq)
                    for event in convert.kv_events(batch, self._block_size):
                        translator.apply(event)
                        relayed = True
            except grpc.aio.AioRpcError as e:
                log.info("KV event stream of %s ended: %s", self.address, _reason(e))
                self._poll_loads(stub)  # no record comes until a new stream's first batch
                if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                    await asyncio.sleep(RESUBSCRIBE_REFUSED_S)
                    continue
                self._check_now.set()  # the engine may be gone: its card should not wait for the next check
            await asyncio.sleep(RESUBSCRIBE_AFTER_S)


def _reason(e: Exception) -> str:
    if isinstance(e, grpc.aio.AioRpcError):
        return f"{e.code().name}: {e.details()}"
    return str(e)
