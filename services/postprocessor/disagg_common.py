"""What both orders of a disaggregated attempt share (disagg_legs.py, sequential; disagg_paired.py, paired)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import Protocol

from meshfront.common.v1 import common_pb2
from meshfront.postprocessor.v1 import postprocessor_pb2
from meshfront.worker.v1 import worker_pb2

from services.common.errors import MeshError
from services.common.pump import Batch

# Only a decode worker that could not resolve a leg's transfer parameters names this param on its error.
TRANSFER_PARAM = "kv_transfer_params"


class LegCall(Protocol):
    """One leg's call on a worker (service.WorkerCall)."""

    async def next_batch(self) -> Batch[worker_pb2.GenerateResponse]: ...

    def cancel(self) -> None: ...

    def fail(self, error: MeshError) -> None: ...


# Feeds worker messages to the request's builder (service._ResponseBuilder.build).
Build = Callable[[list[worker_pb2.GenerateResponse]], postprocessor_pb2.GenerateResponse | None]
Opener = Callable[[str, worker_pb2.GenerateRequest], LegCall]
# Runs an opened decode call through the request's builder (Postprocessor._attempt with ``call``).
Decode = Callable[[str, common_pb2.PreprocessedRequest, LegCall],
                  AsyncGenerator[postprocessor_pb2.GenerateResponse, None]]


def one_token(request: common_pb2.PreprocessedRequest) -> bool:
    return request.stop.HasField("max_tokens") and request.stop.max_tokens <= 1


def drop_leg_budget(messages: list[worker_pb2.GenerateResponse], request: common_pb2.PreprocessedRequest) -> None:
    """A prefill leg's finish LENGTH is its own one-token budget's, not the request's: dropped (in place),
    unless the request wanted one token."""
    if messages and messages[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH and not one_token(request):
        last = worker_pb2.GenerateResponse()
        last.CopyFrom(messages[-1])
        last.finish_reason = common_pb2.FINISH_REASON_UNSPECIFIED
        messages[-1] = last
