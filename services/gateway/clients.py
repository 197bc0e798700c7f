"""How the gateway reaches the preprocessor, router and postprocessor.

Each has one small interface (the Protocols below) with two implementations: a
gRPC client (the split mesh, one Deployment per service: here, the router's per-replica one in
router_replicas.py and the postprocessor's multiplexed one in postprocessor_mux.py), and a direct
in-process call on the same service object the remote server wraps, which
belongs to the all-in-one process (services/allinone/clients.py) because it
imports the stage packages. The seam passes proto messages, which are plain
Python objects in-process, so the two shapes run the same code.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

import grpc
from meshfront.postprocessor.v1 import postprocessor_pb2
from meshfront.preprocessor.v1 import preprocessor_pb2, preprocessor_pb2_grpc
from meshfront.router.v1 import router_pb2

from services.common import tls as mesh_tls
from services.common import tracing
from services.common.error_interceptor import request_id_metadata
from services.common.grpc_server import spread_options
from services.common.stage_wait import DEFAULT_WAIT_S, StageCaller

# A target may list several replicas ("ipv4:10.0.0.1:9200,10.0.0.2:9200") or be a DNS name
# resolving to many (a headless Kubernetes Service); spread calls over all of them (spread_options). Pinged: a
# frozen replica's connection is dropped in about 2 s and its calls are sent again to another.


class PreprocessorClient(Protocol):
    async def preprocess(self, req: preprocessor_pb2.PreprocessRequest) -> preprocessor_pb2.PreprocessResponse: ...

    async def preprocess_embeddings(self, req: preprocessor_pb2.PreprocessEmbeddingsRequest
                                    ) -> preprocessor_pb2.PreprocessEmbeddingsResponse: ...


class RouterClient(Protocol):
    async def route(self, req: router_pb2.RouteRequest) -> router_pb2.RouteResponse: ...

    async def release(self, req: router_pb2.ReleaseRequest) -> None: ...

    async def report_first_token(self, report: router_pb2.FirstTokenReport) -> None: ...

    async def release_batch(self, req: router_pb2.ReleaseBatchRequest) -> None: ...


class PostprocessorClient(Protocol):
    """Over the mesh: ``postprocessor_mux.MuxPostprocessor``, one multiplexed stream per replica."""

    def generate(self, req: postprocessor_pb2.GenerateRequest
                 ) -> AsyncIterator[list[postprocessor_pb2.GenerateResponse]]:
        """The request's responses in order, as lists of every one that was ready together (one write)."""


def channel(target: str, tls: mesh_tls.MeshTls | None = None) -> grpc.aio.Channel:
    return mesh_tls.channel(target, spread_options(target), tls)


# The preprocessor's calls wait out a restart of their stage (services/common/stage_wait.py);
# ``unreachable`` tells /health and the gateway's gRPC health (stage_watch.py) when one stays away.


class GrpcPreprocessor:
    def __init__(self, target: str, tls: mesh_tls.MeshTls | None = None, wait_s: float = DEFAULT_WAIT_S):
        self.stage = StageCaller(channel(target, tls), "preprocessor", wait_s)
        self._stub = preprocessor_pb2_grpc.PreprocessorServiceStub(self.stage.channel)

    async def preprocess(self, req):
        metadata = tracing.call_metadata(request_id_metadata(req.request.request_id))
        return await self.stage.call(lambda: self._stub.Preprocess(req, metadata=metadata))

    async def preprocess_embeddings(self, req):
        return await self.stage.call(lambda: self._stub.PreprocessEmbeddings(req))
