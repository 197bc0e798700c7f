"""After a migration the next response names the worker the sequence moved to (nvext worker_id)."""

from __future__ import annotations

import pytest
from meshfront.postprocessor.v1 import postprocessor_pb2
from meshfront.router.v1 import router_pb2

from services.common.errors import WorkerFailed
from services.models.qwen import EOS_TOKEN_IDS
from services.postprocessor.core.tokenizers_cache import TokenizerCache
from services.postprocessor.migration import Migrator
from services.postprocessor.service import Postprocessor
from tests.unit.postprocessor.stream_pump import StreamPump
from tests.unit.postprocessor.test_postprocessor_service import EOS, FakeCall, ids_of, msg

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


class PerCallWorkers:
    """Each call replays its own script (the first worker fails mid-stream, the second finishes)."""

    def __init__(self, scripts):
        self.scripts = list(scripts)
        self.addresses: list[str] = []

    def generate(self, address, request):
        self.addresses.append(address)
        call = FakeCall(self.scripts.pop(0))
        return StreamPump(call.read, call.cancel)


class OneMoreWorker:
    async def route(self, req: router_pb2.RouteRequest) -> router_pb2.RouteResponse:
        assert list(req.exclude_worker_ids) == ["w1"]
        return router_pb2.RouteResponse(worker_id="w2", address="w2:1")


async def test_the_first_response_after_a_migration_names_the_new_worker(tokenizer, demo_model_dir):
    ids = ids_of(tokenizer, "one two three four")
    workers = PerCallWorkers([[msg(ids[:2], prompt=5), 0.01, WorkerFailed("gone")],
                              [msg(ids[2:], prompt=7), msg([EOS_TOKEN_IDS[0]], EOS)]])
    req = postprocessor_pb2.GenerateRequest(worker_address="fake:1", worker_id="w1")
    req.options.model_dir = str(demo_model_dir)
    req.request.request_id = "r1"
    req.request.token_ids.extend(ids_of(tokenizer, "<|im_start|>assistant\n"))
    req.request.stop.stop_token_ids_hidden.extend(EOS_TOKEN_IDS)
    post = Postprocessor(workers, TokenizerCache(), migrator=Migrator(OneMoreWorker(), limit=3))
    responses = [r async for r in post.generate(req)]
    assert workers.addresses == ["fake:1", "w2:1"]
    assert "".join(r.text for r in responses) == "one two three four"
    assert [r.worker_id for r in responses if r.worker_id] == ["w2"]
    assert responses[0].worker_id == ""  # the first worker is the routed one, which the caller knows
