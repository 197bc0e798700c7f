"""Wires the embedding worker: model directory -> SentenceEmbedder -> EmbedBatcher -> the worker entry."""

from __future__ import annotations

from collections.abc import Sequence

from services.workers import entry
from services.workers.embed.batcher import EmbedBatcher
from services.workers.embed.config import EmbedConfig, parse_config
from services.workers.embed.model import SentenceEmbedder
from services.workers.embed.server import build_server, embedding_card
from services.workers.embed.service import EmbedService
from services.workers.metrics import embed_metrics


def build_service(cfg: EmbedConfig) -> EmbedService:
    """Loads the weights (blocking, a few seconds) before the port opens: "port open" means "ready"."""
    embedder = SentenceEmbedder(cfg.worker.model_dir, threads=cfg.threads)
    batcher = EmbedBatcher(embedder.embed, max_batch_size=cfg.max_batch_size, max_batch_tokens=cfg.max_batch_tokens,
                           observe=embed_metrics().batch_inputs.observe)
    return EmbedService(embedder.shape, batcher, cfg.worker.model_name)


async def build(cfg: EmbedConfig, events: entry.KvEvents) -> entry.Serving:
    service = build_service(cfg)
    server = build_server(cfg.worker, service)
    service.batcher.start()
    return entry.Serving(cfg.worker, server, embedding_card(cfg.worker, cfg.worker.advertised_address(server.port)),
                         closers=[service.batcher.close])


KIND = entry.WorkerKind(name="embed", parse=parse_config, log_level=lambda cfg: cfg.worker.log_level,
                        prepare=lambda cfg: cfg, build=build)


def main(argv: Sequence[str] | None = None) -> None:
    entry.main(KIND, argv)
