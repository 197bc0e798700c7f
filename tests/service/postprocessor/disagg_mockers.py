"""Two real mockers and the real postprocessor for a disaggregated request's legs: what the disaggregation service
tests share (test_disagg_legs.py, test_disagg_pipelined.py, test_disagg_migration.py, test_disagg_release_decode.py;
the ``mockers`` and ``post`` fixtures are in conftest.py).

The mocker is deterministic (pseudo-random mode), so a disaggregated answer must equal the aggregated one token
for token.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from meshfront.postprocessor.v1 import postprocessor_pb2

from services.postprocessor.service import Postprocessor
from services.workers import entry
from services.workers.mocker.transfer import transfer_metrics

PROMPT = [151644, 872, 198, *range(1000, 1200), 151645, 198, 151644, 77091, 198]  # 210 tokens: 13 full blocks
TOKENS = 40


class Mocker:
    def __init__(self, serving: entry.Serving, engine) -> None:
        self.serving, self.engine = serving, engine
        self.id, self.address = serving.card.worker_id, serving.card.address

    @property
    def busy(self) -> bool:
        """Holds blocks (for a sequence or a transfer) or has work queued."""
        return bool(self.engine.cache.active_blocks or self.engine.scheduler.has_work())


def request(demo_model_dir, decode: Mocker, prefill: Mocker | None = None,
            tokens: int = TOKENS) -> postprocessor_pb2.GenerateRequest:
    req = postprocessor_pb2.GenerateRequest(worker_address=decode.address, worker_id=decode.id)
    if prefill is not None:
        req.prefill_worker_address, req.prefill_worker_id = prefill.address, prefill.id
    req.options.model_dir = str(demo_model_dir)
    req.request.request_id = uuid.uuid4().hex
    req.request.model = "demo"
    req.request.token_ids.extend(PROMPT)
    req.request.sampling.seed = 77
    req.request.stop.max_tokens = tokens
    req.request.stop.ignore_eos = True
    return req


async def collect(post: Postprocessor, req) -> list[postprocessor_pb2.GenerateResponse]:
    return [r async for r in post.generate(req)]


async def wait_idle(*mockers: Mocker, within_s: float = 0.2) -> float:
    """Seconds until none of ``mockers`` holds anything; fails past ``within_s``."""
    start = time.monotonic()
    while any(m.busy for m in mockers):
        assert time.monotonic() - start < within_s, [(m.id, m.engine.cache.active_blocks) for m in mockers]
        await asyncio.sleep(0.005)
    return time.monotonic() - start


def pulled() -> float:
    return transfer_metrics()[0].labels("pulled")._value.get()


async def received(worker, request_id: str) -> None:
    """Until the scripted ``worker`` has got a request with this id."""
    while not any(r.request.request_id == request_id for r in worker.received):
        await asyncio.sleep(0.005)


async def hang_up_during_the_prefill(post: Postprocessor, req: postprocessor_pb2.GenerateRequest,
                                     prefill: Mocker) -> None:
    """Starts ``req`` and hangs up while ``prefill`` still computes its prompt, before any token came."""
    stream = post.generate(req)
    task = asyncio.ensure_future(stream.__anext__())
    await asyncio.sleep(0.3)
    assert prefill.busy and not task.done()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await stream.aclose()
