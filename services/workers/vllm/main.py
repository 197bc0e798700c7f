"""Wires the vLLM worker: flags -> AsyncLLM (model loaded) -> the worker entry (services/workers/entry.py),
which publishes its KV events and load on NATS and serves it. With ``--data-parallel-size``, each engine core's
KV events and load go out as its rank's stream, and the card declares the ranks (services/workers/engine_ranks.py).

Runs where vllm is importable: an engine image, or the engine environment ``meshfront run
--worker-kind vllm`` prepares (services/launcher/engine_env.py). Failures to start (a bad model
directory, an unsupported architecture, too little memory) end the process with vLLM's own
message on one line and status 1, before anything is registered.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

from services.common.discovery import KV_RELEASE_BY_DECODE
from services.workers import entry
from services.workers.config import WorkerConfig
from services.workers.engine_ranks import ranked_kv_events
from services.workers.engine_worker import EngineStartFailed, descendants, engine_kv_events, root_message
from services.workers.vllm.config import VllmConfig, parse_config
from services.workers.vllm.lora import lora_settings, start_adapters
from services.workers.vllm.release_grpc import add_kv_release

log = logging.getLogger("services.workers.vllm")


async def build(prepared: tuple[VllmConfig, Any], events: entry.KvEvents) -> entry.Serving:
    from services.workers.vllm.engine import VllmEngine

    cfg, engine_args = prepared
    engine = VllmEngine(engine_args)
    try:
        with _engine_processes_die_with_a_signal():
            await engine.start()
    except Exception as e:
        raise EngineStartFailed(root_message(e)) from e
    adapters = await start_adapters(lora_settings(engine_args, cfg.lora_modules), engine)
    worker = dataclasses.replace(cfg.worker(context_length=engine.max_model_len, block_size=engine.block_size),
                                 input_modalities=engine.input_modalities)
    log.info("vLLM engine ready: context %d, block size %d, %d KV blocks", engine.max_model_len,
             engine.block_size, engine.num_kv_blocks)
    ranks = engine.dp_ranks
    closers = _kv_events(cfg, engine, events, worker)
    serving = entry.engine_serving(worker, engine, load=None if engine.has_ranks else engine.read_load,
                                   total_kv_blocks=engine.num_kv_blocks,
                                   max_num_batched_tokens=engine.max_num_batched_tokens,
                                   max_num_seqs=engine.max_num_seqs, failed=engine.failed,
                                   closers=closers, adapters=adapters, kv_release_by=KV_RELEASE_BY_DECODE,
                                   dp_size=len(ranks), dp_start_rank=ranks.start)
    add_kv_release(serving.server.server, engine.release_kv)  # a decode worker frees its prefill peer's blocks
    return serving


def _kv_events(cfg: VllmConfig, engine: Any, events: entry.KvEvents,
               worker: WorkerConfig) -> list[Callable[[], Awaitable[None]]]:
    """The engine's KV events to NATS: one stream, or one per rank, each with its rank's load."""
    from services.workers.vllm.kv_events import batch_decoder, rank_sources

    # The engine tells the publishers when its load moves (its stat logger, each request's start and end).
    if not engine.has_ranks:
        closers = engine_kv_events(cfg, engine.block_size, batch_decoder(), events.listener(worker, load_pushed=True))
    else:
        log.info("vLLM data-parallel ranks %d..%d", engine.dp_ranks.start, engine.dp_ranks[-1])
        # Not registered: the cores publish nothing (no sources) and no rank has a listener.
        closers = ranked_kv_events(rank_sources(engine.llm.get_kv_event_sources()), engine.block_size, batch_decoder,
                                   lambda rank: events.listener(worker, rank, functools.partial(engine.read_load, rank),
                                                                load_pushed=True))
    engine.load.listeners.extend(publisher.load_changed for publisher in events.publishers.values())
    return closers


@contextlib.contextmanager
def _engine_processes_die_with_a_signal() -> Iterator[None]:
    """While the engine loads (a minute), SIGTERM/SIGINT also kill its processes: vLLM's engine core
    would otherwise outlive this one, blocked on its socket. Once serving, the server's drain owns
    the signals and closes the engine properly."""

    def stop(signum, _frame) -> None:
        for child in descendants(os.getpid()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        os._exit(128 + signum)  # nothing is registered yet, there is nothing else to undo

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def prepare(cfg: VllmConfig) -> tuple[VllmConfig, Any]:
    """Checks that vLLM imports here, then runs vLLM's own parser over the engine flags (a bad one exits
    there, naming it; one that parses but cannot work with this worker is a ConfigError)."""
    from services.workers.vllm.media import enable_pil_processors

    enable_pil_processors()  # before vLLM is imported: its processes inherit it
    try:
        import vllm  # noqa: F401 - a clear message when the engine is not installed here
    except ImportError:
        raise entry.Unavailable(
            "vLLM is not installed in this environment; `meshfront run --worker-kind vllm` prepares one "
            "(.venv-vllm), or use an image built FROM vLLM's (deploy/docker)") from None
    if cfg.args.host in ("127.0.0.1", "localhost"):
        # vLLM's internal sockets bind this address; the default is the machine's outward one.
        os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
    engine_args = cfg.engine_args()
    lora_settings(engine_args, cfg.lora_modules)  # --lora-modules without --enable-lora: refused before loading
    return cfg, engine_args


# parse_config checks the flags without importing vllm (fail fast, with every problem listed).
KIND = entry.WorkerKind(name="vllm", parse=parse_config, log_level=lambda cfg: cfg.args.log_level,
                        prepare=prepare, build=build)


def main(argv: Sequence[str] | None = None) -> None:
    entry.main(KIND, argv)


if __name__ == "__main__":
    main()
