"""One entry-point shape for every worker kind: mocker, hf, embed, vllm and sglang.

``main(kind, argv)`` does, in this order:

1. parse ``argv`` (flags and env twins); a bad value, whether argparse or the kind's checks find it,
   is one line on stderr and exit status 2, before anything loads;
2. logging, then ``prepare``: what the environment must offer (torch, the engine's package) and the
   engine's own flag parsing; a missing package is one line and exit 1, an engine flag that cannot
   work is a bad value;
3. ``build``: the kind loads its model or starts its engine (so that "port open" means
   "ready"), binds its gRPC server (``worker_grpc_server``: the one drain grace, ``--drain-grace-s``) and
   names its card. A kind whose engine has a KV cache connects the engine's events to the listener it
   is handed (``KvEvents``): the mocker's cache calls it directly, a real engine's ZMQ events reach it
   through ``BlockHashTranslator``; either way one publisher sends them, with the engine's
   ``read_load``, to the routers;
4. ``/metrics``, registration in discovery (one path for every kind: the card goes out once the
   server serves, and leaves first on SIGTERM so that routers stop picking the worker while its
   streams finish), serving until SIGTERM/SIGINT or the engine's death;
5. the closers: the kind's (engine, event subscriber), then the publisher.

An engine that fails to start or dies ends the process with one line and exit 1 (``EngineStartFailed``,
``EngineDied``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

from services.common import model_files, nats_connection, nats_tls, tracing
from services.common.discovery import KV_RELEASE_BY_PREFILL, LoraAdapter, Registrar, WorkerCard
from services.common.grpc_server import GrpcServer, run, setup_logging
from services.common.kv_events import KvEventListener
from services.common.metrics import serve_metrics
from services.common.namespace import Namespace
from services.common.service_main import bad_value
from services.workers.config import WorkerConfig
from services.workers.engine import Engine
from services.workers.kv_events import KvEventPublisher, LoadReader
from services.workers.lora import WorkerAdapters
from services.workers.metrics import worker_metrics
from services.workers.server import EngineDied, EngineStartFailed, build_server, worker_card

log = logging.getLogger(__name__)

C = TypeVar("C")  # the kind's parsed config
P = TypeVar("P")  # what ``prepare`` makes of it


class Unavailable(RuntimeError):
    """The environment lacks what the kind needs (torch, the engine's package): one line, exit 1."""


class KvEvents:
    """The worker's KV event publisher, made when the kind knows its final config (id, model, NATS).

    A kind whose engine has a KV cache asks ``listener`` once and connects its engine's events to
    what it gets: None for a worker that does not register or runs with --no-kv-events (nobody routes by its
    cache). A worker with
    data-parallel ranks asks once per rank (``dp_rank``, with that rank's engine's ``load`` reader): each rank's
    events are a stream of their own (services/common/dp_ranks.py).
    """

    def __init__(self) -> None:
        self.publishers: dict[int | None, KvEventPublisher] = {}

    @property
    def publisher(self) -> KvEventPublisher | None:
        """The publisher of a worker without ranks."""
        return self.publishers.get(None)

    def listener(self, worker: WorkerConfig, dp_rank: int | None = None,
                 load: LoadReader | None = None, *, load_pushed: bool = False) -> KvEventListener | None:
        """``load_pushed``: the kind calls the publisher's ``load_changed`` on every load change (KvEventPublisher)."""
        if worker.register and worker.kv_events and dp_rank not in self.publishers:
            self.publishers[dp_rank] = KvEventPublisher(worker.nats_url, worker.worker_id, worker.model_name, load,
                                                        namespace=worker.scope, dp_rank=dp_rank,
                                                        load_pushed=load_pushed)
        return self.publishers.get(dp_rank)


@dataclasses.dataclass
class Serving:
    """What a kind's ``build`` hands the one serving path: a loaded model behind a bound server."""

    worker: WorkerConfig  # final: an engine-sized kind's has the engine's own context window and block size
    server: GrpcServer  # bound, not started, its servicer added
    card: WorkerCard  # what discovery says about this worker while it serves
    # Run in order after the server stopped (the engine's close, an event subscriber's).
    closers: list[Callable[[], Awaitable[None]]] = dataclasses.field(default_factory=list)
    load: LoadReader | None = None  # the engine's ``read_load``, published with its KV events
    # Returns when the engine can serve no more (a real engine's death watch).
    failed: Callable[[], Awaitable[BaseException]] | None = None
    # The LoRA adapters held (services/workers/lora.py); each change goes out on the card at once.
    adapters: WorkerAdapters | None = None


def engine_serving(worker: WorkerConfig, engine: Engine, *, load: LoadReader | None = None,
                   total_kv_blocks: int = 0, max_num_batched_tokens: int = 0, max_num_seqs: int = 0,
                   failed: Callable[[], Awaitable[BaseException]] | None = None,
                   closers: Sequence[Callable[[], Awaitable[None]]] = (),
                   adapters: WorkerAdapters | None = None,
                   kv_release_by: str = KV_RELEASE_BY_PREFILL, dp_size: int = 1, dp_start_rank: int = 0) -> Serving:
    """``Serving`` for a started ``Engine`` behind WorkerService (every kind but embed); ``adapters``:
    its LoRA adapters, already loaded (``WorkerAdapters.start``), for a kind that serves LoRA;
    ``kv_release_by``: the card's ``kv_release_by`` (services/common/discovery.py); ``dp_size`` and
    ``dp_start_rank``: its data-parallel ranks (services/common/dp_ranks.py; ``engine`` serves them all)."""
    server = build_server(worker, engine, adapters)
    card = worker_card(worker, worker.advertised_address(server.port), total_kv_blocks=total_kv_blocks,
                       max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs, adapters=adapters,
                       kv_release_by=kv_release_by, dp_size=dp_size, dp_start_rank=dp_start_rank)
    return Serving(worker, server, card, closers=[*closers, engine.close], load=load, failed=failed,
                   adapters=adapters)


@dataclasses.dataclass(frozen=True)
class WorkerKind(Generic[C, P]):
    """How one worker kind is made; its ``main.py`` declares one and calls ``main(KIND, argv)``."""

    name: str  # the command (``meshfront mocker``) and the prefix of its messages
    parse: Callable[[Sequence[str]], C]  # raises ValueError (ConfigError) naming every bad value
    log_level: Callable[[C], str]
    prepare: Callable[[C], P]  # raises Unavailable, or ValueError for an engine flag that cannot work
    build: Callable[[P, KvEvents], Awaitable[Serving]]


def main(kind: WorkerKind[C, P], argv: Sequence[str] | None = None) -> None:
    """Runs one worker of ``kind`` until SIGTERM/SIGINT; ``argv`` defaults to the process's own."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        cfg = kind.parse(argv)  # fail fast, with every problem listed, before anything loads
        nats_context = nats_tls.context(nats_tls.from_argv(argv))  # the worker's NATS identity (its card)
    except ValueError as e:
        bad_value(kind.name, e)
    setup_logging(kind.log_level(cfg))
    nats_connection.use_tls(nats_context)
    tracing.configure(kind.name)  # on only when the environment names an OTLP collector
    try:
        prepared = kind.prepare(cfg)
    except Unavailable as e:
        sys.exit(f"{kind.name}: {e}")
    except ValueError as e:
        bad_value(kind.name, e)
    try:
        run(lambda: serve(kind, prepared))
    except EngineStartFailed as e:
        sys.exit(f"{kind.name}: the engine failed to start: {e}")
    except EngineDied as e:
        sys.exit(f"{kind.name}: the engine died: {e}")


async def serve(kind: WorkerKind[Any, P], prepared: P) -> None:
    """Builds the worker and serves it, registered in discovery for as long as it serves."""
    events = KvEvents()
    serving = await kind.build(prepared, events)
    publishers = list(events.publishers.values())
    try:
        for publisher in publishers:
            if serving.load is not None and publisher.dp_rank is None:  # a rank's reader came with its listener
                publisher.set_load_reader(serving.load)
            await publisher.start()  # connects in the background: the worker does not wait for NATS
            # Stopped first once the server has: its load reader reads the engine, which the next closers close.
            serving.closers.insert(0, publisher.close)
        await _serve_registered(serving)
    finally:
        for publisher in publishers:
            await publisher.close()  # a no-op when it closed with the server, as it does unless serving failed


def _card_updater(registrar: Registrar) -> Callable[[tuple[LoraAdapter, ...]], Awaitable[None]]:
    """Republishes the card with the adapters now held (a load or unload returns once it is out)."""

    async def update(adapters: tuple[LoraAdapter, ...]) -> None:
        card = registrar.card
        await registrar.update(dataclasses.replace(card, model=dataclasses.replace(card.model,
                                                                                 lora_adapters=adapters)))
    return update


def _model_files_publisher(card: WorkerCard) -> Callable[[Any], Awaitable[None]] | None:
    """Publishes the model's tokenizer/template/config files before the card that names them goes out."""
    if not card.model.model_files:
        return None

    async def publish(js: Any) -> None:
        published = await model_files.publish(js, card.model.model_dir, Namespace(card.namespace))
        if published != card.model.model_files:  # the files changed on disk since the card was made
            raise RuntimeError(f"the files in {card.model.model_dir} changed while the worker started; restart it")
        log.info("published the files of %s (%s) to NATS", card.model.name, published)

    return publish


async def _serve_registered(serving: Serving) -> None:
    worker, server = serving.worker, serving.server
    serve_metrics(worker.metrics_port, worker.host)
    metrics = worker_metrics()  # every documented name from the first scrape, not the first request
    metrics.info.labels(serving.card.role, serving.card.kind, serving.card.model.name).set(1)
    registrar: Registrar | None = None
    if worker.register:
        registrar = Registrar(worker.nats_url, serving.card, before_first_put=_model_files_publisher(serving.card))
        if serving.adapters is not None:
            serving.adapters.on_change = _card_updater(registrar)
        server.on_drain(registrar.close)  # routers stop picking this worker while its streams finish
        # The card goes out after a NATS round trip, by which time serve_until_signal has started
        # the (already bound) server.
        await registrar.start()
        log.info("registering %s for model %s at %s", serving.card.worker_id, serving.card.model.name,
                 serving.card.address)
    death: BaseException | None = None

    async def watch(failed: Callable[[], Awaitable[BaseException]]) -> None:
        nonlocal death
        death = await failed()
        log.error("the engine died (%s); leaving discovery and stopping", death)
        if registrar is not None:
            await registrar.close()  # before anything else: routers must stop picking this worker
        server.request_stop()

    watcher = asyncio.create_task(watch(serving.failed), name="engine-death-watch") if serving.failed else None
    try:
        await server.serve_until_signal()
    finally:
        if watcher is not None:
            watcher.cancel()
        if registrar is not None:
            await registrar.close()
        for close in serving.closers:
            await close()
    if death is not None:
        raise EngineDied(str(death)) from death
