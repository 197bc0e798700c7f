"""Builds the postprocessor from its config: chat processor, worker client, migration, idle timeout.

Used by the postprocessor's own process (main.py) and by the all-in-one process (services/allinone),
so both shapes honour every postprocessor flag.
"""

from __future__ import annotations

import logging

from services.common import tls as mesh_tls
from services.common.assembly import Built
from services.common.discovery import WorkerRegistry
from services.common.engine_channels import CardsByAddress
from services.common.model_files import ModelFilesResolver
from services.common.warmup import warm_each_new_model
from services.postprocessor.config import PostprocessorConfig
from services.postprocessor.core.parsers.backends import load_chat_processor
from services.postprocessor.core.tokenizers_cache import TokenizerCache
from services.postprocessor.engine_client import ByProtocolWorkerClient, EngineWorkerClient
from services.postprocessor.kv_release import GrpcKvReleaser
from services.postprocessor.migration import Migrator, RouterClient
from services.postprocessor.mux_client import MuxWorkerClient
from services.postprocessor.router_client import GrpcRouterClient
from services.postprocessor.service import Postprocessor

log = logging.getLogger(__name__)

def build(cfg: PostprocessorConfig, registry: WorkerRegistry, tls: mesh_tls.MeshTls | None = None,
          router: RouterClient | None = None) -> Built[Postprocessor]:
    """The postprocessor; migrations ask ``router`` (the all-in-one's in-process router) or else a gRPC
    client of ``--router`` (none when it is empty or ``--migration-limit`` is 0). Each model that
    ``registry`` discovers has its tokenizer loaded at once (the caller starts the registry).

    Raises ``ChatProcessorUnavailable`` when ``--chat-processor`` names an extra that is not installed.
    """
    chat_processor = load_chat_processor(cfg.chat_processor)  # vllm / sglang: their import takes seconds
    log.info("output parsers: %s (--chat-processor)", chat_processor.name)
    closers = []
    if router is None and cfg.router and cfg.migration_limit:
        grpc_router = GrpcRouterClient(cfg.router, tls, cfg.router_wait_s)
        router = grpc_router
        closers.append(grpc_router.close)
    # Cards that name an engine protocol are stock engines reached over their own gRPC (engine_client.py).
    cards = CardsByAddress()
    registry.subscribe(cards.changed)
    engines = EngineWorkerClient()
    workers = MuxWorkerClient(tls)
    releaser = GrpcKvReleaser(tls, registry.workers_for)  # the prefill worker's card says who releases
    model_files = ModelFilesResolver(cfg.nats_url)  # the tokenizer comes from NATS: no model volume needed
    postprocessor = Postprocessor(ByProtocolWorkerClient(workers, engines, cards),
                                  migrator=Migrator(router, cfg.migration_limit, cfg.migration_max_seq_len),
                                  idle_timeout_s=cfg.stream_idle_timeout_s, chat_processor=chat_processor,
                                  kv_releaser=releaser, model_files=model_files,
                                  tokenizers=TokenizerCache(trust_remote_code=cfg.trust_remote_code),
                                  auto_tool_choice=cfg.enable_auto_tool_choice)
    closers.append(warm_each_new_model(registry, postprocessor.warm))
    return Built(postprocessor, closers=[postprocessor.close, workers.close, engines.close, releaser.close,
                                         model_files.close,
                                         *closers],
                 parts={"workers": workers, "router": router})
