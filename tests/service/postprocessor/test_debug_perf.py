"""--dyn-debug-perf (DYN_DEBUG_PERF): one line per request and stage, with numbers, when on; none when off.

The gateway's OpenAI servicer on a real gRPC server, over the real stages composed in-process as the all-in-one
process composes them (preprocessor with the demo model's template and tokenizer, router, postprocessor), in
front of the scripted fake worker (a real gRPC server, tests/service/postprocessor/fake_worker.py).
"""

from __future__ import annotations

import collections
import logging
import re

import grpc
import orjson
import pytest
from google.api import httpbody_pb2
from meshfront.common.v1 import common_pb2
from meshfront.gateway.v1 import gateway_pb2_grpc
from meshfront.worker.v1 import worker_pb2

from services.allinone.clients import InProcessPostprocessor, InProcessPreprocessor, InProcessRouter
from services.allinone.config import parse_config as allinone_config
from services.common import debug_perf
from services.common.discovery import ModelCard, WorkerCard
from services.common.grpc_server import GrpcServer
from services.gateway.core.pipeline import Pipeline
from services.gateway.openai.server import GatewayServicer
from services.models.qwen import EOS_TOKEN_IDS
from services.postprocessor.service import Postprocessor
from services.preprocessor.service import Preprocessor
from services.router import config as router_config
from services.router.service import Router

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]

MODEL = "perf-demo"
NUMBER = r"\d+\.\d\d"
SECTION = rf"{NUMBER}/{NUMBER}ms\(\d+\)"
LINE = re.compile(rf"perf request=(\S+) stage=(\w+) wall_ms={NUMBER} cpu_ms={NUMBER}((?: \w+={SECTION})+)$")
SECTIONS = {"gateway": {"parse", "render"}, "preprocess": {"render_tokenize", "hash"}, "route": {"route"},
            "postprocess": {"detokenize_parse"}}


@pytest.fixture(scope="module")
async def gateway(fake_worker, demo_model_dir):
    worker, address = fake_worker
    answer = [worker_pb2.GenerateResponse(token_ids=[9707, 0], prompt_tokens=9),
              worker_pb2.GenerateResponse(token_ids=[EOS_TOKEN_IDS[0]], finish_reason=common_pb2.FINISH_REASON_EOS)]
    worker.scripts = collections.defaultdict(lambda: answer)  # the gateway makes the request ids up
    card = ModelCard(MODEL, str(demo_model_dir), block_size=4)
    post = Postprocessor(idle_timeout_s=0)
    workers = [WorkerCard("w1", address, card)]
    pipeline = Pipeline(InProcessPreprocessor(Preprocessor(lambda name: card if name == MODEL else None)),
                        InProcessRouter(Router(lambda name: workers if name == MODEL else [])),
                        InProcessPostprocessor(post))
    models = {MODEL: [WorkerCard("w1", address, card)]}
    server = GrpcServer("gateway", "127.0.0.1", 0, grace_s=0)
    gateway_pb2_grpc.add_GatewayServiceServicer_to_server(GatewayServicer(pipeline, lambda: models), server.server)
    await server.start()
    async with grpc.aio.insecure_channel(server.address) as channel:
        yield gateway_pb2_grpc.GatewayServiceStub(channel)
    await server.stop()
    await post.close()


@pytest.fixture
def perf_on():
    debug_perf.configure(True)
    yield
    debug_perf.configure(False)


async def chat(stub, stream: bool) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "stream": stream}
    async for _ in stub.ChatCompletions(httpbody_pb2.HttpBody(content_type="application/json",
                                                              data=orjson.dumps(body))):
        pass


def perf_lines(caplog) -> list[re.Match]:
    lines = [r.getMessage() for r in caplog.records if r.name == "meshfront.perf"]
    matches = [LINE.match(line) for line in lines]
    assert all(matches), lines
    return [m for m in matches if m is not None]


@pytest.mark.parametrize("stream", [False, True])
async def test_each_stage_logs_one_line_with_its_sections_keyed_by_the_request_id(gateway, perf_on, caplog,
                                                                                   stream):
    caplog.set_level(logging.INFO, logger="meshfront.perf")
    await chat(gateway, stream)
    lines = perf_lines(caplog)
    assert sorted(m.group(2) for m in lines) == sorted(SECTIONS)
    assert len({m.group(1) for m in lines}) == 1  # one request id across the stages
    for m in lines:
        assert {s.split("=")[0] for s in m.group(3).split()} == SECTIONS[m.group(2)], m.group(0)


async def test_no_line_when_off(gateway, caplog):
    caplog.set_level(logging.INFO, logger="meshfront.perf")
    await chat(gateway, stream=True)
    assert [r for r in caplog.records if r.name == "meshfront.perf"] == []


def test_the_flag_is_common_with_dynamo_s_env_twin():
    assert router_config.parse_config([], {"DYN_DEBUG_PERF": "true"}).dyn_debug_perf is True
    assert router_config.parse_config(["--no-dyn-debug-perf"], {"DYN_DEBUG_PERF": "true"}).dyn_debug_perf is False
    assert router_config.parse_config([], {}).dyn_debug_perf is False
    assert allinone_config(["--dyn-debug-perf"], {}).dyn_debug_perf is True
