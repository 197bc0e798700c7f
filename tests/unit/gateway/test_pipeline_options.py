"""Each fact reaches the postprocessor once, from its owner (services/gateway/core/pipeline.py).

The request's own postprocess options (tools, tool choice, single tool call, stream interval) come
from the gateway; the model's (model directory, parsers) from the preprocessor, which no longer echoes
the request's. And the first-token report goes in the form the router that routed the request reads.
"""

from __future__ import annotations

import asyncio

import orjson
import pytest
from meshfront.common.v1 import common_pb2
from meshfront.postprocessor.v1 import postprocessor_pb2
from meshfront.router.v1 import router_pb2

from services.allinone.clients import InProcessPreprocessor
from services.common.discovery import ModelCard
from services.gateway.core.openai_request import parse_chat
from services.gateway.core.pipeline import Pipeline
from services.gateway.core.to_proto import chat_to_preprocess, postprocess_options
from services.models import default_test_model_dir
from services.preprocessor.service import Preprocessor

pytestmark = pytest.mark.unit

MODEL = "demo"
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


class Router:
    """Routes to one worker, answering as a router that does (or, ``old``, does not) read FirstTokenReport."""

    def __init__(self, old: bool = False) -> None:
        self.old = old
        self.released: list[router_pb2.ReleaseRequest] = []
        self.reported: list[router_pb2.FirstTokenReport] = []

    async def route(self, req):
        return router_pb2.RouteResponse(worker_id="w1", address="127.0.0.1:1", report_first_token=True,
                                        reads_first_token_reports=not self.old)

    async def release(self, req):
        self.released.append(req)

    async def report_first_token(self, report):
        self.reported.append(report)

    async def release_batch(self, req):
        raise AssertionError("the pipeline sends one at a time; RidingReleases batches them")


class Postprocessor:
    def __init__(self) -> None:
        self.requests: list[postprocessor_pb2.GenerateRequest] = []

    async def generate(self, req):
        self.requests.append(req)
        yield [postprocessor_pb2.GenerateResponse(text="hi", completion_tokens=1, prompt_tokens=9, cached_tokens=4,
                                                  finish_reason=common_pb2.FINISH_REASON_STOP)]


def pipeline(router: Router) -> tuple[Pipeline, Postprocessor]:
    card = ModelCard(MODEL, str(default_test_model_dir()), reasoning_parser="qwen3", tool_call_parser="hermes")
    post = Postprocessor()
    pre = InProcessPreprocessor(Preprocessor(lambda name: card if name == MODEL else None))
    return Pipeline(pre, router, post, stream_interval=2), post


async def run(p: Pipeline, body: dict) -> None:
    req = parse_chat(orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], **body}))
    prep = chat_to_preprocess(req, "rid")
    async for _ in p.run([prep], 1, options=postprocess_options(req, prep)):
        pass
    await asyncio.sleep(0)  # the fire-and-forget router notes


async def test_the_gateway_adds_the_requests_options_to_the_models():
    p, post = pipeline(Router())
    await run(p, {"tools": [TOOL], "tool_choice": "required", "parallel_tool_calls": False,
                  "nvext": {"stream_interval": 3}})
    options = post.requests[0].options
    assert (options.model_dir, options.tool_call_parser, options.reasoning_parser) == \
        (str(default_test_model_dir()), "hermes", "qwen3")
    assert orjson.loads(options.tools_json) == [TOOL]
    assert options.tool_choice.mode == common_pb2.TOOL_CHOICE_MODE_REQUIRED
    assert options.single_tool_call and options.stream_interval == 3


async def test_without_tools_or_an_interval_the_deployments_default_applies():
    p, post = pipeline(Router())
    await run(p, {"parallel_tool_calls": False})  # moot without tools: no single-call limit to carry
    options = post.requests[0].options
    assert not options.tools_json and not options.HasField("tool_choice") and not options.single_tool_call
    assert options.stream_interval == 2


@pytest.mark.parametrize("old", [False, True])
async def test_the_first_token_is_reported_in_the_form_the_router_reads(old):
    router = Router(old=old)
    p, _ = pipeline(router)
    await run(p, {})
    await asyncio.sleep(0)
    if old:  # a router from before FirstTokenReport: the deprecated ReleaseRequest.first_token
        first, end = router.released
        assert (first.request_id, first.first_token, first.cached_tokens, first.prompt_tokens) == ("rid", True, 4, 9)
        assert not router.reported
    else:
        assert router.reported == [router_pb2.FirstTokenReport(request_id="rid", cached_tokens=4, prompt_tokens=9)]
        [end] = router.released
    assert end == router_pb2.ReleaseRequest(request_id="rid")
