"""Wires the SGLang worker: flags -> sglang.Engine (model loaded) -> KV events and load on NATS -> worker server.

Runs where sglang is importable: an engine image, or the engine environment ``meshfront run
--worker-kind sglang`` prepares (services/launcher/engine_env.py). Failures to start (a bad
model directory, an unsupported architecture, too little memory) end the process with SGLang's
own message on one line and status 1, before anything is registered. SGLang raises a generic
"scheduler died during initialization" when the failure happened in its scheduler process; that
process logs the real traceback just above.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from services.common.grpc_server import run, setup_logging
from services.workers.config import ConfigError
from services.workers.engine_worker import EngineStartFailed, root_message, serve_engine
from services.workers.server import EngineDied
from services.workers.sglang.config import SglangConfig, parse_config

log = logging.getLogger("services.workers.sglang")

# Below this many tokens per page the routers hash (and index) nearly every token of a prompt.
SMALL_PAGE = 16


async def serve(cfg: SglangConfig, server_args: Any) -> None:
    from services.workers.sglang.engine import SglangEngine
    from services.workers.sglang.kv_events import batch_decoder

    engine = SglangEngine(server_args)
    try:
        with _exit_on_a_signal_while_loading():
            await engine.start()
    except Exception as e:  # any failure to start is reported the same way
        detail = root_message(e)
        if engine.child_failed:  # SGLang's own message is then generic ("scheduler died ...")
            detail += " (the failing SGLang process logged its traceback above)"
        raise EngineStartFailed(detail) from e
    worker = cfg.worker(context_length=engine.max_model_len, block_size=engine.block_size)
    log.info("SGLang engine ready: context %d, page size %d, %d KV pages", engine.max_model_len,
             engine.block_size, engine.num_kv_blocks)
    if worker.register and engine.block_size < SMALL_PAGE:
        log.warning("SGLang's page size is %d: KV routing hashes every %d token(s) of a prompt; "
                    "--page-size %d is cheaper for the mesh", engine.block_size, engine.block_size, SMALL_PAGE)
    await serve_engine(worker, cfg, engine, batch_decoder())


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


def main(argv: Sequence[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        cfg = parse_config(argv)  # fail fast, with every problem listed, before sglang is imported
    except ConfigError as e:
        sys.exit(f"sglang: {e}")
    try:
        import sglang  # noqa: F401 - a clear message when the engine is not installed here
    except ImportError:
        sys.exit("sglang: SGLang is not installed in this environment; `meshfront run --worker-kind sglang` "
                 "prepares one (.venv-sglang), or use an image built FROM SGLang's (deploy/docker)")
    try:
        import services.workers.sglang.engine  # noqa: F401 - SGLang's engine needs more than sglang itself
    except ImportError as e:
        sys.exit(f"sglang: SGLang's engine does not import in this environment: {e}")
    setup_logging(cfg.args.log_level)
    try:
        server_args = cfg.server_args()  # SGLang's parser: a bad engine flag exits here, naming it
    except ConfigError as e:
        sys.exit(f"sglang: {e}")
    try:
        run(lambda: serve(cfg, server_args))
    except EngineStartFailed as e:
        sys.exit(f"sglang: the engine failed to start: {e}")
    except EngineDied as e:
        sys.exit(f"sglang: the engine died: {e}")


if __name__ == "__main__":
    main()
