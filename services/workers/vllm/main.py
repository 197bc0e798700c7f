"""Wires the vLLM worker: flags -> AsyncLLM (model loaded) -> KV events and load on NATS -> worker server.

Runs where vllm is importable: an engine image, or the engine environment ``meshfront run
--worker-kind vllm`` prepares (services/launcher/engine_env.py). Failures to start (a bad model
directory, an unsupported architecture, too little memory) end the process with vLLM's own
message on one line and status 1, before anything is registered.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from collections.abc import Iterator, Sequence

from services.common.grpc_server import run, setup_logging
from services.workers.config import ConfigError
from services.workers.engine_worker import EngineStartFailed, descendants, root_message, serve_engine
from services.workers.server import EngineDied
from services.workers.vllm.config import VllmConfig, parse_config

log = logging.getLogger("services.workers.vllm")


async def serve(cfg: VllmConfig) -> None:
    from services.workers.vllm.engine import VllmEngine
    from services.workers.vllm.kv_events import batch_decoder

    engine = VllmEngine(cfg.engine_args())
    try:
        with _engine_processes_die_with_a_signal():
            await engine.start()
    except Exception as e:  # noqa: BLE001 - any failure to start is reported the same way
        raise EngineStartFailed(root_message(e)) from e
    worker = cfg.worker(context_length=engine.max_model_len, block_size=engine.block_size)
    log.info("vLLM engine ready: context %d, block size %d, %d KV blocks", engine.max_model_len,
             engine.block_size, engine.num_kv_blocks)
    await serve_engine(worker, cfg, engine, batch_decoder())


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


def main(argv: Sequence[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        cfg = parse_config(argv)  # fail fast, with every problem listed, before vllm is imported
    except ConfigError as e:
        sys.exit(f"vllm: {e}")
    try:
        import vllm  # noqa: F401 - a clear message when the engine is not installed here
    except ImportError:
        sys.exit("vllm: vLLM is not installed in this environment; `meshfront run --worker-kind vllm` "
                 "prepares one (.venv-vllm), or use an image built FROM vLLM's (deploy/docker)")
    if cfg.args.host in ("127.0.0.1", "localhost"):
        # vLLM's internal sockets bind this address; the default is the machine's outward one.
        os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
    setup_logging(cfg.args.log_level)
    try:
        run(lambda: serve(cfg))
    except EngineStartFailed as e:
        sys.exit(f"vllm: the engine failed to start: {e}")
    except EngineDied as e:
        sys.exit(f"vllm: the engine died: {e}")


if __name__ == "__main__":
    main()
