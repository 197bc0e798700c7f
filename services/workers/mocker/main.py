"""Wires the mocker: model directory -> output policy -> MockerEngine -> the worker entry (../entry.py); with
``--media image|video``, the media simulator behind MediaService (../media/server.py) instead."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from services.common import tls as mesh_tls
from services.common.errors import InvalidRequest
from services.common.kv_events import KvEventListener
from services.workers import entry
from services.workers.dp_engines import RankedEngines
from services.workers.lora import WorkerAdapters
from services.workers.media.server import media_serving
from services.workers.mocker.config import MockerConfig, parse_config
from services.workers.mocker.engine import MockerEngine
from services.workers.mocker.lora import SimulatedLora
from services.workers.mocker.media_engine import SimulatedMediaEngine
from services.workers.mocker.outputs import OutputPolicy
from services.workers.mocker.transfer import KvPuller
from services.workers.mocker.transfer_grpc import GrpcKvPuller, add_kv_transfer
from services.workers.model_dir import load_tokenizer, read_model_info
from services.workers.server import EngineStartFailed


def build_engine(cfg: MockerConfig, listener: KvEventListener | None = None,
                 puller: KvPuller | None = None) -> MockerEngine:
    """Loads the tokenizer and script (blocking, startup only) and builds the engine."""
    return _engine_factory(cfg, puller)(listener)


def _engine_factory(cfg: MockerConfig, puller: KvPuller | None) -> Callable[[KvEventListener | None], MockerEngine]:
    """Loads the tokenizer and script once (blocking, startup only); makes an engine per call (one per rank)."""
    tokenizer = load_tokenizer(cfg.worker.model_dir)
    outputs = OutputPolicy.build(tokenizer, script_path=cfg.engine.script or None,
                                 output_text=cfg.engine.output_text)
    eos = read_model_info(cfg.worker.model_dir).eos_token_ids
    return lambda listener: MockerEngine(cfg.engine, outputs, eos_token_ids=eos, listener=listener, puller=puller)


def _ranked(cfg: MockerConfig, events: entry.KvEvents, puller: KvPuller) -> RankedEngines:
    """--dp-size: one engine per rank, each with its own KV event stream and load (services/workers/dp_engines.py)."""
    make = _engine_factory(cfg, puller)
    engines: dict[int, MockerEngine] = {}
    for rank in range(cfg.dp_size):
        engines[rank] = engine = make(events.listener(cfg.worker, rank))
        publisher = events.publishers.get(rank)  # none when the worker does not register
        if publisher is not None:
            publisher.set_load_reader(engine.read_load)
    return RankedEngines(engines, {r: e.backlog for r, e in engines.items()})


async def build(cfg: MockerConfig, events: entry.KvEvents) -> entry.Serving:
    if cfg.media is not None:  # an image or video simulator: no tokenizer, no KV cache, no KV events
        return media_serving(cfg.worker, SimulatedMediaEngine(cfg.media), cfg.jobs)
    # The simulated cache tells its listener what it holds, as a real engine's KV events do. Every mocker
    # can take either leg of a disaggregated request (its role on the card steers the router): it pulls a
    # decode leg's blocks from prefill workers and serves the pulls of the blocks it holds (transfer.py).
    puller = GrpcKvPuller(mesh_tls.from_config(cfg.worker))
    if cfg.dp_size > 1:
        return await _serve_ranked(cfg, _ranked(cfg, events, puller), puller)
    engine = build_engine(cfg, listener=events.listener(cfg.worker), puller=puller)
    await engine.start()
    adapters = await _adapters(cfg)
    serving = entry.engine_serving(cfg.worker, engine, load=engine.read_load,
                                   total_kv_blocks=cfg.engine.num_gpu_blocks,
                                   max_num_batched_tokens=cfg.engine.max_num_batched_tokens,
                                   max_num_seqs=cfg.engine.max_num_seqs, closers=[puller.close], adapters=adapters)
    engine.holds.identify(serving.card.worker_id, serving.card.address)
    add_kv_transfer(serving.server.server, engine.holds)
    return serving


async def _adapters(cfg: MockerConfig) -> WorkerAdapters | None:
    adapters = WorkerAdapters(cfg.lora, SimulatedLora()) if cfg.lora.enabled else None
    if adapters is not None:
        try:
            await adapters.start()  # --lora-modules: a bad directory stops the worker before it registers
        except InvalidRequest as e:
            raise EngineStartFailed(e.message) from e
    return adapters


async def _serve_ranked(cfg: MockerConfig, ranked: RankedEngines, puller: GrpcKvPuller) -> entry.Serving:
    """A worker of data-parallel ranks: agg or decode (config.py refuses prefill), so it holds no prefill leg's
    blocks for others to pull and serves no KvTransferService; its decode legs pull as one worker's do."""
    await ranked.start()
    adapters = await _adapters(cfg)
    return entry.engine_serving(cfg.worker, ranked, total_kv_blocks=cfg.engine.num_gpu_blocks,
                                max_num_batched_tokens=cfg.engine.max_num_batched_tokens,
                                max_num_seqs=cfg.engine.max_num_seqs, closers=[puller.close], adapters=adapters,
                                dp_size=cfg.dp_size)


KIND = entry.WorkerKind(name="mocker", parse=parse_config, log_level=lambda cfg: cfg.worker.log_level,
                        prepare=lambda cfg: cfg, build=build)


def main(argv: Sequence[str] | None = None) -> None:
    entry.main(KIND, argv)
