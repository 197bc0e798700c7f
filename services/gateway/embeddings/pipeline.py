"""One embeddings request through the mesh: preprocess (tokenize), route, embed, release.

The postprocessor is skipped: an embedding has no tokens to detokenize and no stream to parse, so
the gateway calls the chosen worker's unary ``Embed`` itself. A worker that fails is excluded and
the request is routed once more (embedding is idempotent: nothing was sent to the client yet).
"""

from __future__ import annotations

from meshfront.preprocessor.v1 import preprocessor_pb2
from meshfront.router.v1 import router_pb2
from meshfront.worker.v1 import worker_pb2

from services.common.errors import NoWorkers, WorkerFailed
from services.gateway import scheduling
from services.gateway.clients import PreprocessorClient, RouterClient
from services.gateway.core.route_lease import RouteLeases
from services.gateway.embeddings.request import EmbeddingsRequest
from services.gateway.embeddings.worker_client import EmbedWorkerClient

ATTEMPTS = 2


def preprocess_request(req: EmbeddingsRequest, request_id: str) -> preprocessor_pb2.PreprocessEmbeddingsRequest:
    return preprocessor_pb2.PreprocessEmbeddingsRequest(request_id=request_id, model=req.model, inputs=[
        preprocessor_pb2.EmbeddingInput(text=x) if isinstance(x, str)
        else preprocessor_pb2.EmbeddingInput(tokens=preprocessor_pb2.TokenIds(ids=x)) for x in req.inputs])


class EmbeddingsPipeline:
    def __init__(self, pre: PreprocessorClient, router: RouterClient, worker: EmbedWorkerClient):
        self.pre = pre
        self.router = router
        self.worker = worker
        self.leases = RouteLeases(router)

    async def run(self, req: EmbeddingsRequest, request_id: str) -> worker_pb2.EmbedResponse:
        prepared = await self.pre.preprocess_embeddings(preprocess_request(req, request_id))
        embed = worker_pb2.EmbedRequest(request_id=request_id, model=req.model, dimensions=req.dimensions,
                                        inputs=[worker_pb2.EmbedInput(token_ids=t.ids) for t in prepared.inputs])
        tokens = sum(len(t.ids) for t in prepared.inputs)
        failed: list[str] = []
        first_failure: WorkerFailed | None = None
        for _ in range(ATTEMPTS):
            try:
                lease = await self.leases.route(scheduling.stamp(router_pb2.RouteRequest(  # class, tenant
                    request_id=request_id, model=req.model, prompt_tokens=tokens, exclude_worker_ids=failed)))
            except NoWorkers:
                if first_failure is not None:
                    raise first_failure from None  # no other worker: the client hears what went wrong
                raise
            async with lease:
                try:
                    return await self.worker.embed(lease.route.address, embed)
                except WorkerFailed as e:
                    first_failure = first_failure or e
                    failed.append(lease.route.worker_id)
        assert first_failure is not None
        raise first_failure
