"""What both orders of a disaggregated attempt share (disagg_legs.py, sequential; disagg_paired.py, paired)."""

from __future__ import annotations

import time

from meshfront.common.v1 import common_pb2
from meshfront.postprocessor.v1 import postprocessor_pb2
from meshfront.worker.v1 import worker_pb2

from services.common.errors import InvalidRequest, MeshError, WorkerFailed
from services.common.pump import Batch
from services.postprocessor.attempt import WorkerCall
from services.postprocessor.migration import WorkerRoute

# Only a decode worker that could not resolve a leg's transfer parameters names this param on its error.
TRANSFER_PARAM = "kv_transfer_params"


def one_token(request: common_pb2.PreprocessedRequest) -> bool:
    return request.stop.HasField("max_tokens") and request.stop.max_tokens <= 1


def drop_leg_budget(messages: list[worker_pb2.GenerateResponse], request: common_pb2.PreprocessedRequest) -> None:
    """A prefill leg's finish LENGTH is its own one-token budget's, not the request's: dropped (in the message
    itself: the call handed it over and nothing else reads it), unless the request wanted one token."""
    if messages and messages[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH and not one_token(request):
        messages[-1].finish_reason = common_pb2.FINISH_REASON_UNSPECIFIED


async def first_batch(call: WorkerCall) -> Batch[worker_pb2.GenerateResponse]:
    """The prefill leg's first batch with messages (the first of them says the attempt's order), or the one that
    says the leg ended or failed before sending any. A cancel here (the client left during the prefill) cancels
    the call: the worker aborts the sequence."""
    try:
        batch = await call.next_batch()
        while not batch.messages and batch.error is None and not batch.ended:
            batch = await call.next_batch()
    except BaseException:
        call.cancel()
        raise
    return batch


def refused_transfer(error: MeshError) -> bool:
    """A decode leg's failure that is the prefill worker's: its decode worker could not resolve the leg's transfer
    parameters (the prefill worker's blocks or bootstrap are gone), and says so with ``param``."""
    return error.param == TRANSFER_PARAM and isinstance(error, (WorkerFailed, InvalidRequest))


def name_both_workers(response: postprocessor_pb2.GenerateResponse, route: WorkerRoute, since: float) -> None:
    """Marks the decode leg's first response: both workers, and the milliseconds from ``since`` (a monotonic
    time; 0: nothing was waited for)."""
    response.worker_id, response.prefill_worker_id = route.worker_id, route.prefill_worker_id
    response.kv_transfer_ms = round((time.monotonic() - since) * 1000, 3) if since else 0.0

