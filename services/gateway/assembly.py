"""Builds the gateway from its config: the pipeline over the three stage clients and its servicers
(OpenAI over HttpBody, KServe, and the edge documents: /metrics, /openapi.json, /docs).

Used by the gateway's own process (main.py, gRPC clients from ``--preprocessor/--router/--postprocessor``)
and by the all-in-one process (services/allinone), which hands in in-process clients instead.
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from grpc_health.v1 import health_pb2
from meshfront.gateway.v1 import (
    anthropic_pb2_grpc,
    edge_pb2_grpc,
    embeddings_pb2_grpc,
    extensions_pb2_grpc,
    gateway_pb2_grpc,
    images_pb2_grpc,
    media_pb2_grpc,
    responses_pb2_grpc,
    videos_pb2_grpc,
)
from prometheus_client import CollectorRegistry

from services.common import tls as mesh_tls
from services.common.assembly import Built
from services.common.discovery import WorkerRegistry
from services.common.engine_channels import CardsByAddress
from services.common.grpc_server import GrpcServer
from services.common.namespace import Namespace
from services.common.stage_wait import DEFAULT_WAIT_S
from services.gateway import auth, clients, frontend_metrics
from services.gateway.anthropic.server import AnthropicServicer
from services.gateway.auth.store import AuthStore
from services.gateway.auth.usage import Usage
from services.gateway.batch.api import BatchApi
from services.gateway.config import ApiSwitches, GatewayConfig
from services.gateway.core.pipeline import Pipeline
from services.gateway.edge.replicas import ReplicaMetrics
from services.gateway.edge.server import EdgeServicer
from services.gateway.embeddings.pipeline import EmbeddingsPipeline
from services.gateway.embeddings.server import EmbeddingsServicer
from services.gateway.embeddings.worker_client import GrpcEmbedWorker
from services.gateway.extensions.engine_factory import ChatEngines
from services.gateway.extensions.loading import load_factory, load_routes
from services.gateway.extensions.routes import Route
from services.gateway.extensions.server import ExtensionRoutesServicer, GatewayState
from services.gateway.images.server import ImagesServicer
from services.gateway.kserve import server as kserve
from services.gateway.lora_api import LoraAdmin
from services.gateway.lora_workers import GrpcLoraWorkers
from services.gateway.media.multipart import parse_form
from services.gateway.media.pipeline import MediaPipeline
from services.gateway.media.server import MediaFilesServicer
from services.gateway.media.store import MediaStore, media_url
from services.gateway.media.worker_client import GrpcMediaWorker
from services.gateway.openai.dispatch import ChatOutput
from services.gateway.openai.server import GatewayServicer
from services.gateway.postprocessor_mux import MuxPostprocessor
from services.gateway.releases import RidingReleases
from services.gateway.responses_api.server import ResponsesServicer
from services.gateway.responses_api.store import ResponseStore
from services.gateway.router_replicas import ReplicaRouters
from services.gateway.stage_watch import StageWatch
from services.gateway.videos.job_store import JobStore
from services.gateway.videos.jobs import VideoJobs
from services.gateway.videos.request import form_fields
from services.gateway.videos.server import VideosServicer
from services.gateway.warmup import Warmup

# The gRPC health service name the gateway's liveness probe asks (deploy/k8s/base/gateway.yaml).
LIVENESS_SERVICE = "liveness"


@dataclasses.dataclass
class Gateway:
    pipeline: Pipeline
    registry: WorkerRegistry
    # Stored /v1/responses responses (NATS JetStream KV, shared by every replica).
    response_store: ResponseStore
    metrics: ReplicaMetrics
    # POST /v1/embeddings: the same preprocessor and router clients, then the embedding worker directly.
    embeddings: EmbeddingsPipeline
    # Images and videos: the router, then the media worker directly; url answers in the media store (NATS).
    media: MediaPipeline
    media_store: MediaStore
    # OpenAI video jobs (NATS KV, shared by every replica), run over ``media`` into ``media_store``.
    video_jobs: VideoJobs
    # The stages reached over gRPC and whether each is unreachable now (none in the all-in-one process).
    stage_probes: dict[str, Callable[[], bool]] = dataclasses.field(default_factory=dict)
    stage_wait_s: float = DEFAULT_WAIT_S
    # The base of media URLs (--public-url); empty: the request's scheme and host.
    public_url: str = ""
    # /v1/load_lora_adapter and /v1/unload_lora_adapter across the workers (None: both answer 404).
    lora_workers: GrpcLoraWorkers | None = None
    # Extension code (--frontend-route-extension, --chat-engine-factory): its HTTP routes, each chat model's hooks.
    extension_routes: tuple[Route, ...] = ()
    chat_engines: ChatEngines | None = None
    # --reasoning-field-name, --enable-anthropic-api, --kserve-grpc-server and the others (config.py).
    api: ApiSwitches = ApiSwitches()
    # /v1/files and /v1/batches (set by ``build``: its lines run on this gateway's own servicers).
    batch_api: BatchApi | None = None
    draining: bool = False

    def __post_init__(self) -> None:
        self.warmup = Warmup(self.pipeline, self.registry)
        self.stages = StageWatch(self.stage_probes, self.stage_wait_s)
        self._server: GrpcServer | None = None
        self.servicer = GatewayServicer(self.pipeline, self.registry.models, lambda: self.draining,
                                        warming=lambda: self.warmup.warming if not self.warmup.ready.is_set() else [],
                                        unavailable=lambda: self.stages.unavailable,
                                        chat_hooks=self.chat_engines.hooks_for if self.chat_engines else None,
                                        lora=LoraAdmin(self.registry.models, self.lora_workers)
                                        if self.lora_workers is not None else None,
                                        chat=ChatOutput(self.api.reasoning_field_name,
                                                        tool_dispatch=self.api.enable_streaming_tool_dispatch,
                                                        reasoning_dispatch=self.api.enable_streaming_reasoning_dispatch))
        self.kserve = kserve.KServeServicer(self.pipeline, self.registry.models, lambda: self.draining,
                                            media=self.media)
        self.responses = ResponsesServicer(self.pipeline, self.registry.models, self.response_store)
        self.anthropic = AnthropicServicer(self.pipeline, self.registry.models, enabled=self.api.enable_anthropic_api,
                                           strip_preamble=self.api.strip_anthropic_preamble)
        self.edge = EdgeServicer(self.metrics, anthropic_api=self.api.enable_anthropic_api)
        self.extension_routes_servicer = ExtensionRoutesServicer(self.extension_routes, GatewayState(
            self.registry.models, self.warmup.ready.is_set, lambda: self.draining))
        self.embeddings_servicer = EmbeddingsServicer(self.embeddings, self.registry.models)
        self.media_files = MediaFilesServicer(self.media_store)
        self.images = ImagesServicer(self.media, self.registry.models, self.media_store, self.public_url)
        self.videos = VideosServicer(self.video_jobs, self.media, self.media_store, self.registry.models,
                                     parse_form=lambda body, ctype: form_fields(parse_form(body, ctype)),
                                     url_for=lambda headers, media_id: media_url(media_id, self.public_url,
                                                                                 dict(headers)),
                                     ttl_s=self.video_jobs.ttl_s)

    async def start_drain(self) -> None:
        self.draining = True

    def add_to(self, server: GrpcServer) -> None:
        """Serves the OpenAI (HttpBody: chat and completions, Responses), Anthropic (HttpBody), edge
        (/metrics, /openapi.json, /docs) and KServe services on ``server``; draining starts with its drain."""
        gateway_pb2_grpc.add_GatewayServiceServicer_to_server(self.servicer, server.server)
        responses_pb2_grpc.add_ResponsesServiceServicer_to_server(self.responses, server.server)
        anthropic_pb2_grpc.add_AnthropicServiceServicer_to_server(self.anthropic, server.server)
        edge_pb2_grpc.add_EdgeServiceServicer_to_server(self.edge, server.server)
        extensions_pb2_grpc.add_ExtensionRoutesServiceServicer_to_server(self.extension_routes_servicer, server.server)
        embeddings_pb2_grpc.add_EmbeddingsServiceServicer_to_server(self.embeddings_servicer, server.server)
        media_pb2_grpc.add_MediaFilesServiceServicer_to_server(self.media_files, server.server)
        images_pb2_grpc.add_ImagesServiceServicer_to_server(self.images, server.server)
        videos_pb2_grpc.add_VideosServiceServicer_to_server(self.videos, server.server)
        if self.batch_api is not None:
            self.batch_api.add_to(server.server)
        kserve.add_to_server(self.kserve, server.server, enabled=self.api.kserve_grpc_server)
        server.on_drain(self.start_drain)
        server.ready_when(self.warmup.ready.wait)
        self._server = server

    async def watch_stages(self) -> None:
        """Keeps the gRPC health (Envoy's and Kubernetes' readiness) NOT_SERVING while a stage is unavailable.

        Liveness asks its own health service, ``LIVENESS_SERVICE``, SERVING while the process answers: a
        router that stays away must make the gateways unready, not get them restarted by their probe.
        """
        server = self._server
        if server is None:
            return  # not serving over gRPC (tests drive the servicers directly)
        await server.health.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)

        async def set_serving(serving: bool) -> None:
            await server.health.set("", health_pb2.HealthCheckResponse.SERVING if serving
                                          else health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.stages.run(set_serving, lambda: self.warmup.ready.is_set() and not self.draining)


def build(cfg: GatewayConfig, registry: WorkerRegistry, tls: mesh_tls.MeshTls | None = None, *,
          preprocessor: clients.PreprocessorClient | None = None, router: clients.RouterClient | None = None,
          postprocessor: clients.PostprocessorClient | None = None) -> Built[Gateway]:
    """The gateway; a stage client not handed in is a gRPC client of the stage's configured target.

    The response store connects to ``cfg.nats_url`` in the background (``start``), in both shapes.
    Embedding workers are always reached over gRPC (they are their own processes in both shapes).
    """
    probes: dict[str, Callable[[], bool]] = {}
    if preprocessor is None:
        preprocessor = grpc_pre = clients.GrpcPreprocessor(cfg.preprocessor, tls, cfg.stage_wait_s)
        probes["preprocessor"] = grpc_pre.stage.unreachable
    route: RidingReleases | ReplicaRouters
    if router is None:  # a channel per replica, each holding its releases (router_replicas.py)
        route = replicas = ReplicaRouters(cfg.router, tls, cfg.stage_wait_s)
        probes["router"] = replicas.unreachable
    else:
        route = RidingReleases(router)
    pre = preprocessor
    closers = []
    if postprocessor is not None:
        post = postprocessor
    else:
        post = mux_post = MuxPostprocessor(cfg.postprocessor, tls, cfg.stage_wait_s)
        probes["postprocessor"] = mux_post.unreachable
        closers.append(mux_post.close)
    namespace = Namespace.of(cfg.namespace)  # its stores and replica subjects (services/common/namespace.py)
    store = ResponseStore(cfg.nats_url, cfg.responses_ttl_s, namespace=namespace)
    # Every request family exists from the first scrape; /metrics at the edge gathers all replicas'.
    recorder = frontend_metrics.configure(cfg.metrics_prefix)
    recorder.watch(registry.models)  # Dynamo's model and per-worker families read the cards when scraped
    metrics = ReplicaMetrics(cfg.nats_url, f"{socket.gethostname()}:{cfg.port}", recorder.registry,
                             namespace=namespace)
    engine_cards = CardsByAddress()  # a stock engine's card (engine_protocol) is embedded over its own gRPC
    registry.subscribe(engine_cards.changed)
    embed_workers = GrpcEmbedWorker(tls, engine_cards)
    media_workers = GrpcMediaWorker(tls)
    lora_workers = GrpcLoraWorkers(tls)
    media_store = MediaStore(cfg.nats_url, cfg.media_url_ttl_s, namespace=namespace)
    media = MediaPipeline(route, media_workers)
    job_store = JobStore(cfg.nats_url, namespace=namespace)
    jobs = VideoJobs(job_store, media_store, media, cfg.media_url_ttl_s)
    # Extension code: the config's check loaded it already (load_* are cached), so nothing here can fail.
    chat_engines = (ChatEngines(load_factory(cfg.chat_engine_factory), registry.models)
                    if cfg.chat_engine_factory else None)
    if chat_engines is not None:
        registry.subscribe(chat_engines.on_change)
    gateway = Gateway(Pipeline(pre, route, post, cfg.stream_interval), registry, response_store=store,
                      metrics=metrics, embeddings=EmbeddingsPipeline(pre, route, embed_workers),
                      media=media, media_store=media_store, video_jobs=jobs,
                      stage_probes=probes, stage_wait_s=cfg.stage_wait_s, public_url=cfg.public_url,
                      lora_workers=lora_workers, api=cfg.api_switches(),
                      extension_routes=load_routes(cfg.frontend_route_extension), chat_engines=chat_engines)
    background, closing = _auth(cfg, namespace, recorder.registry, metrics.replica)
    gateway.batch_api = batch_api = _batch_api(cfg, namespace, gateway)
    # The video jobs and batches close first: each running one hands its lease back through the open stores.
    return Built(gateway, background=[store.run, media_store.run, job_store.run, jobs.sweep, metrics.run,
                                      gateway.warmup.run, gateway.watch_stages, *background,
                                      *batch_api.background],
                 closers=[jobs.close, batch_api.close, gateway.warmup.close, route.close, store.close,
                          media_store.close, job_store.close, metrics.close, embed_workers.close, media_workers.close,
                          lora_workers.close, *closers, *closing])


def _batch_api(cfg: GatewayConfig, namespace: Namespace, gateway: Gateway) -> BatchApi:
    """The Batch API, whose lines run on this gateway's own servicers (in process, through the front door)."""
    rpcs = {"/v1/chat/completions": gateway.servicer.ChatCompletions, "/v1/completions": gateway.servicer.Completions,
            "/v1/embeddings": gateway.embeddings_servicer.Embeddings,
            "/v1/responses": gateway.responses.CreateResponse}
    return BatchApi(cfg.nats_url, namespace, rpcs, parse_form, max_concurrency=cfg.batch_max_concurrency)


def _auth(cfg: GatewayConfig, namespace: Namespace, registry: CollectorRegistry,
          replica: str) -> tuple[list[Callable[[], Coroutine[Any, Any, None]]], list[Callable[[], Awaitable[None]]]]:
    """--auth: the process's gate (services/gateway/auth/), its per-tenant families in the request metrics'
    registry (so /metrics at the edge has them); (background tasks, closers). Off: none installed."""
    if not cfg.auth:
        auth.install(None)
        return [], []
    store = AuthStore(cfg.nats_url, namespace)
    usage = Usage(replica, store.put_usage)
    gate = auth.Gate(store, usage)
    registry.register(usage)
    auth.install(gate)

    async def close() -> None:
        auth.install(None)
        registry.unregister(usage)
        await gate.close()
        await store.close()
    return [store.run, gate.run, usage.run], [close]
