"""gRPC glue shared by the engine worker kinds: the WorkerService servicer, the server and the card.

The lifecycle (load, register, serve until SIGTERM/SIGINT, deregister first, close) is every kind's
one entry shape: services/workers/entry.py.
"""

from __future__ import annotations

import grpc
from meshfront.worker.v1 import worker_pb2, worker_pb2_grpc

from services.common import tls as mesh_tls
from services.common.discovery import KV_RELEASE_BY_PREFILL, LoraAdapter, ModelCard, WorkerCard
from services.common.errors import relay
from services.common.grpc_server import GrpcServer
from services.common.model_files import model_files_reference
from services.common.mux_session import MuxSession, MuxSessions
from services.workers.config import WorkerConfig
from services.workers.engine import Engine
from services.workers.lora import WorkerAdapters
from services.workers.service import WorkerService


class WorkerServicer(worker_pb2_grpc.WorkerServiceServicer):
    def __init__(self, service: WorkerService):
        self._service = service
        self.sessions = MuxSessions()

    async def Generate(self, request: worker_pb2.GenerateRequest, context: grpc.aio.ServicerContext) -> None:
        # A caller's cancel closes the generator, which aborts the sequence and frees its KV blocks.
        await relay(self._service.generate(request), context)

    async def GenerateStream(self, request_iterator, context: grpc.aio.ServicerContext) -> None:
        # Like Generate, this task owns the stream: when the caller goes away grpc.aio cancels it,
        # and MuxSession aborts every sequence still running on the stream.
        session = MuxSession(self._service.generate, context.write, worker_pb2.GenerateStreamResponse,
                             "worker.GenerateStream")
        await self.sessions.serve(session, request_iterator)

    async def LoadLoraAdapter(self, request: worker_pb2.LoadLoraAdapterRequest,
                              context: grpc.aio.ServicerContext) -> worker_pb2.LoadLoraAdapterResponse:
        adapter = LoraAdapter(request.adapter.name, request.adapter.path)
        loaded = await self._service.adapters.load(adapter)
        return worker_pb2.LoadLoraAdapterResponse(loaded=loaded)

    async def UnloadLoraAdapter(self, request: worker_pb2.UnloadLoraAdapterRequest,
                                context: grpc.aio.ServicerContext) -> worker_pb2.UnloadLoraAdapterResponse:
        await self._service.adapters.unload(request.name)
        return worker_pb2.UnloadLoraAdapterResponse()


def worker_card(cfg: WorkerConfig, address: str, *, total_kv_blocks: int = 0,
                max_num_batched_tokens: int = 0, max_num_seqs: int = 0, adapters: WorkerAdapters | None = None,
                kv_release_by: str = KV_RELEASE_BY_PREFILL, dp_size: int = 1, dp_start_rank: int = 0) -> WorkerCard:
    """``total_kv_blocks`` and ``max_num_batched_tokens`` are one engine's: with data-parallel ranks
    (``dp_size`` from ``dp_start_rank``, services/common/dp_ranks.py), each rank's."""
    model = ModelCard(name=cfg.model_name, model_dir=cfg.model_dir, context_length=cfg.context_length,
                      block_size=cfg.block_size, tool_call_parser=cfg.tool_call_parser,
                      reasoning_parser=cfg.reasoning_parser, input_modalities=cfg.input_modalities,
                      lora_adapters=adapters.adapters if adapters is not None else (),
                      model_files=model_files_reference(cfg.scope, cfg.model_dir),
                      structural_tag_mode=cfg.structural_tags.mode, structural_tag_scope=cfg.structural_tags.scope,
                      structural_tag_schema=cfg.structural_tags.schema,
                      default_thinking_mode=cfg.default_thinking_mode)
    lora = adapters.settings if adapters is not None else None
    return WorkerCard(worker_id=cfg.worker_id, address=address, model=model, kind=cfg.kind,
                      total_kv_blocks=total_kv_blocks, max_num_batched_tokens=max_num_batched_tokens,
                      max_num_seqs=max_num_seqs,
                      role=cfg.role, max_loras=lora.max_loras if lora is not None else 0,
                      lora_runtime_loading=lora.runtime_loading if lora is not None else False,
                      kv_release_by=kv_release_by, namespace=cfg.scope.name,
                      data_parallel_start_rank=dp_start_rank, data_parallel_size=dp_size, kv_events=cfg.kv_events)


def worker_grpc_server(cfg: WorkerConfig) -> GrpcServer:
    """Every worker kind's gRPC server, bound, not started: it drains by the one ``--drain-grace-s``."""
    return GrpcServer(f"worker-{cfg.kind}", cfg.host, cfg.port, grace_s=cfg.drain_grace_s,
                      tls=mesh_tls.from_config(cfg))


def build_server(cfg: WorkerConfig, engine: Engine, adapters: WorkerAdapters | None = None) -> GrpcServer:
    """A bound (not yet started) server exposing ``engine`` as WorkerService (with its LoRA adapters)."""
    server = worker_grpc_server(cfg)
    servicer = WorkerServicer(WorkerService(engine, cfg.input_modalities, adapters))
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(servicer, server.server)
    server.on_drain(servicer.sessions.drain)  # multiplexed streams end when their running sequences have
    return server


class EngineStartFailed(RuntimeError):
    """The engine could not start; the message is the engine's own, on one line (exit status 1)."""


class EngineDied(RuntimeError):
    """The engine's own process died; the worker deregistered and stopped (exit status 1)."""
