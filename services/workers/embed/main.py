"""Wires the embedding worker: model directory -> SentenceEmbedder -> EmbedBatcher -> worker server."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from services.common.grpc_server import run, setup_logging
from services.common.metrics import embed_metrics
from services.workers.config import ConfigError
from services.workers.embed.batcher import EmbedBatcher
from services.workers.embed.config import EmbedConfig, parse_config
from services.workers.embed.model import SentenceEmbedder
from services.workers.embed.server import serve_embedder
from services.workers.embed.service import EmbedService


def build_service(cfg: EmbedConfig) -> EmbedService:
    """Loads the weights (blocking, a few seconds) before the port opens: "port open" means "ready"."""
    embedder = SentenceEmbedder(cfg.worker.model_dir, threads=cfg.threads)
    batcher = EmbedBatcher(embedder.embed, max_batch_size=cfg.max_batch_size, max_batch_tokens=cfg.max_batch_tokens,
                           observe=embed_metrics().batch_inputs.observe)
    return EmbedService(embedder.shape, batcher, cfg.worker.model_name)


async def serve(argv: Sequence[str]) -> None:
    cfg = parse_config(argv)
    setup_logging(cfg.worker.log_level)
    await serve_embedder(cfg.worker, build_service(cfg))


def main() -> None:
    try:
        parse_config(sys.argv[1:])  # fail fast, with every problem listed, before any loop starts
    except ConfigError as e:
        sys.exit(f"embed: {e}")
    run(lambda: serve(sys.argv[1:]))
