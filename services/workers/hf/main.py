"""Wires the hf worker: model directory -> HfEngine (model loaded before serving) -> worker server."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from services.common.grpc_server import run, setup_logging
from services.workers.config import ConfigError
from services.workers.hf.config import HfConfig, parse_config
from services.workers.hf.engine import HfEngine
from services.workers.model_dir import read_model_info
from services.workers.server import serve_worker


def build_engine(cfg: HfConfig) -> HfEngine:
    info = read_model_info(cfg.worker.model_dir)
    return HfEngine(cfg.worker.model_dir, context_length=cfg.worker.context_length,
                    eos_token_ids=info.eos_token_ids, threads=cfg.threads)


async def serve(argv: Sequence[str]) -> None:
    cfg = parse_config(argv)
    setup_logging(cfg.worker.log_level)
    # serve_worker starts the engine (loads the model) before it binds and registers.
    await serve_worker(cfg.worker, build_engine(cfg))


def main() -> None:
    try:
        parse_config(sys.argv[1:])  # fail fast, with every problem listed, before any loop starts
    except ConfigError as e:
        sys.exit(f"hf: {e}")
    try:
        import torch  # noqa: F401 - only to give a clear message when the extra is missing
    except ImportError:
        sys.exit("hf: torch is not installed; install the hf extra: pip install -e '.[hf]'")
    run(lambda: serve(sys.argv[1:]))
