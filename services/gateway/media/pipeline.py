"""One media request through the mesh: route, generate on the chosen worker, release.

No preprocessor and no postprocessor: a prompt for a diffusion model is not tokenized by the mesh and a
picture has nothing to detokenize, so the gateway routes (``prompt_tokens=0``, as for embeddings) and
calls the worker's ``GenerateMedia`` itself. A worker that fails before its first event is excluded and
the request routed once more (nothing reached the client yet, and the same seed gives the same bytes);
after the first event a failure is the client's to hear. The router's booking is released however the
request ends, and closing the iterator (the client hung up) cancels the worker's call, which stops its
denoising loop at the next step.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from meshfront.router.v1 import router_pb2
from meshfront.worker.v1 import media_pb2

from services.common.errors import NoWorkers, WorkerFailed
from services.gateway.clients import RouterClient
from services.gateway.core.route_lease import RouteLease, RouteLeases
from services.gateway.media.worker_client import MediaWorkerClient

ATTEMPTS = 2


class MediaPipeline:
    def __init__(self, router: RouterClient, worker: MediaWorkerClient):
        self.router = router
        self.worker = worker
        self.leases = RouteLeases(router)

    async def _route(self, req: media_pb2.GenerateMediaRequest, failed: list[str],
                     first_failure: WorkerFailed | None) -> RouteLease:
        try:
            return await self.leases.route(router_pb2.RouteRequest(
                request_id=req.request_id, model=req.model, prompt_tokens=0, exclude_worker_ids=failed))
        except NoWorkers:
            if first_failure is not None:
                raise first_failure from None  # no other worker: the client hears what went wrong
            raise

    async def run(self, req: media_pb2.GenerateMediaRequest) -> AsyncIterator[media_pb2.GenerateMediaResponse]:
        """The worker's events, ``done`` last; a stream that ends without ``done`` is ``WorkerFailed``."""
        failed: list[str] = []
        first_failure: WorkerFailed | None = None
        for _ in range(ATTEMPTS):
            async with await self._route(req, failed, first_failure) as lease:
                events = self.worker.generate(lease.route.address, req)
                try:
                    try:
                        first = await anext(events)
                    except WorkerFailed as e:
                        first_failure = first_failure or e
                        failed.append(lease.route.worker_id)
                        continue
                    except StopAsyncIteration:
                        raise WorkerFailed("the media worker ended its answer without a result") from None
                    yield first
                    if first.HasField("done"):
                        return
                    async for event in events:
                        yield event
                        if event.HasField("done"):
                            return
                    raise WorkerFailed("the media worker ended its answer without a result")
                finally:
                    await events.aclose()  # cancels the worker's call if it still runs
        assert first_failure is not None
        raise first_failure
