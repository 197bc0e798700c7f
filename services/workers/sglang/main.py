"""Wires the SGLang worker: flags -> sglang.Engine (model loaded) -> the worker entry (services/workers/entry.py),
which publishes its KV events and load on NATS and serves it. With ``--dp-size``/``--attn-dp-size``, each rank's
KV events and load go out as its own stream, and the card declares the ranks (services/workers/engine_ranks.py).

Runs where sglang is importable: an engine image, or the engine environment that
``python -m services.launcher.engine_env sglang`` prepares (.venv-sglang). Failures to start (a bad
model directory, an unsupported architecture, too little memory) end the process with SGLang's
own message on one line and status 1, before anything is registered. SGLang raises a generic
"scheduler died during initialization" when the failure happened in its scheduler process; that
process logs the real traceback just above.
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

from services.workers import entry
from services.workers.config import WorkerConfig
from services.workers.engine_ranks import ranked_kv_events
from services.workers.engine_worker import EngineStartFailed, engine_kv_events, root_message
from services.workers.sglang.config import SglangConfig, parse_config

log = logging.getLogger("services.workers.sglang")

# Below this many tokens per page the routers hash (and index) nearly every token of a prompt.
SMALL_PAGE = 16


async def build(prepared: tuple[SglangConfig, Any], events: entry.KvEvents) -> entry.Serving:
    from services.workers.sglang.engine import SglangEngine

    cfg, server_args = prepared
    engine = SglangEngine(server_args, reasoning_parser=cfg.args.reasoning_parser)
    try:
        with _exit_on_a_signal_while_loading():
            await engine.start()
    except Exception as e:  # any failure to start is reported the same way
        detail = root_message(e)
        if engine.child_failed:  # SGLang's own message is then generic ("scheduler died ...")
            detail += " (the failing SGLang process logged its traceback above)"
        raise EngineStartFailed(detail) from e
    worker = dataclasses.replace(cfg.worker(context_length=engine.max_model_len, block_size=engine.block_size),
                                 input_modalities=engine.input_modalities)
    engine.bootstrap_host = worker.advertised_address(0).rsplit(":", 1)[0]  # the host part, as peers reach it
    log.info("SGLang engine ready: context %d, page size %d, %d KV pages", engine.max_model_len,
             engine.block_size, engine.num_kv_blocks)
    if worker.register and engine.block_size < SMALL_PAGE:
        log.warning("SGLang's page size is %d: KV routing hashes every %d token(s) of a prompt; "
                    "--page-size %d is cheaper for the mesh", engine.block_size, engine.block_size, SMALL_PAGE)
    closers = _kv_events(cfg, server_args, engine, events, worker)
    ranked = engine.dp_size > 1
    return entry.engine_serving(worker, engine, load=None if ranked else engine.read_load,
                                total_kv_blocks=engine.num_kv_blocks,
                                max_num_batched_tokens=engine.max_num_batched_tokens, failed=engine.failed,
                                closers=closers, dp_size=engine.dp_size)


def _kv_events(cfg: SglangConfig, server_args: Any, engine: Any, events: entry.KvEvents,
               worker: WorkerConfig) -> list[Callable[[], Awaitable[None]]]:
    """The engine's KV events to NATS: one stream, or one per rank, each with its rank's load."""
    from services.workers.sglang.kv_events import batch_decoder, rank_sources

    if engine.dp_size <= 1:
        return engine_kv_events(cfg, engine.block_size, batch_decoder(engine.media_pads), events.listener(worker))
    log.info("SGLang data-parallel ranks 0..%d", engine.dp_size - 1)
    if not cfg.kv_events_endpoint:
        return []  # not registered: the schedulers publish nothing and nobody listens
    return ranked_kv_events(rank_sources(server_args.kv_events_config, engine.dp_size), engine.block_size,
                            lambda: batch_decoder(engine.media_pads),
                            lambda rank: events.listener(worker, rank, functools.partial(engine.read_load, rank)))


@contextlib.contextmanager
def _exit_on_a_signal_while_loading() -> Iterator[None]:
    """While the engine loads (minutes), SIGTERM/SIGINT end the process at once. SGLang's children
    die with it (they set PR_SET_PDEATHSIG); a graceful exit would first wait for the load to finish
    in its thread. Once serving, the server's drain owns the signals and closes the engine properly."""

    def stop(signum, _frame) -> None:
        os._exit(128 + signum)  # nothing is registered yet, there is nothing else to undo

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def prepare(cfg: SglangConfig) -> tuple[SglangConfig, Any]:
    """Checks that SGLang imports here, then runs SGLang's own parser over the engine flags (a bad one
    exits there, naming it; one that parses but cannot work with this worker is a ConfigError)."""
    try:
        import sglang  # noqa: F401 - a clear message when the engine is not installed here
    except ImportError:
        raise entry.Unavailable(
            "SGLang is not installed in this environment; `python -m services.launcher.engine_env sglang` "
            "prepares one (.venv-sglang; run the worker with its python), or use an image built FROM "
            "SGLang's (deploy/docker)") from None
    try:
        import services.workers.sglang.engine  # noqa: F401 - SGLang's engine needs more than sglang itself
    except ImportError as e:
        raise entry.Unavailable(f"SGLang's engine does not import in this environment: {e}") from None
    return cfg, cfg.server_args()


# parse_config checks the flags without importing sglang (fail fast, with every problem listed).
KIND = entry.WorkerKind(name="sglang", parse=parse_config, log_level=lambda cfg: cfg.args.log_level,
                        prepare=prepare, build=build)


def main(argv: Sequence[str] | None = None) -> None:
    entry.main(KIND, argv)


if __name__ == "__main__":
    main()
