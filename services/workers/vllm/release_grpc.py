"""gRPC glue of the vLLM worker's release (transfer.py, "release"): ``KvTransferService.ReleaseKv`` on the worker's
own port. A vLLM decode worker frees the blocks its prefill peer holds for a decode leg that will not come; the
postprocessor sends it the release because the vLLM card says ``kv_release_by`` decode. ``PullKv`` is not served
(vLLM's connector moves the blocks itself): UNIMPLEMENTED, as the servicer's default.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from meshfront.worker.v1 import kv_transfer_pb2, kv_transfer_pb2_grpc

from services.workers.vllm.transfer import release_params

Release = Callable[[dict[str, Any]], Awaitable[None]]


class KvReleaseServicer(kv_transfer_pb2_grpc.KvTransferServiceServicer):
    def __init__(self, release: Release):
        self._release = release

    async def ReleaseKv(self, request: kv_transfer_pb2.ReleaseKvRequest,
                        context: grpc.aio.ServicerContext) -> kv_transfer_pb2.ReleaseKvResponse:
        params = release_params(request.kv_transfer_params)
        if params is None:
            return kv_transfer_pb2.ReleaseKvResponse(released=False)
        await self._release(params)
        return kv_transfer_pb2.ReleaseKvResponse(released=True)


def add_kv_release(server: grpc.aio.Server, release: Release) -> None:
    kv_transfer_pb2_grpc.add_KvTransferServiceServicer_to_server(KvReleaseServicer(release), server)
