"""The Anthropic servicer on a real gRPC server at 127.0.0.1:0: failures mid-stream and before the first byte.

The preprocessor is the real one (in-process, the demo model's template and tokenizer); the router
and postprocessor are scripted fakes of their client interfaces (services/gateway/clients.py), so a
test can make the stream break after some output, or a stage fail with a bug, which a healthy mesh
never does on demand. Calls go through the generated AnthropicService stub, as Envoy's transcoder
makes them, and the trailers Envoy's Lua filter reads are checked.
"""

from __future__ import annotations

import grpc
import orjson
import pytest
from google.api import httpbody_pb2
from meshfront.gateway.v1 import anthropic_pb2_grpc
from meshfront.postprocessor.v1 import postprocessor_pb2
from meshfront.router.v1 import router_pb2

from services.allinone.clients import InProcessPreprocessor
from services.common.discovery import ModelCard, WorkerCard
from services.common.errors import Overloaded, WorkerFailed
from services.common.grpc_server import GrpcServer
from services.gateway.anthropic.server import AnthropicServicer
from services.gateway.core.pipeline import Pipeline
from services.models import default_test_model_dir
from services.preprocessor.service import Preprocessor

pytestmark = pytest.mark.service

MODEL = "anthropic-demo"


class ScriptedRouter:
    """Routes every request to one worker; ``fail`` makes routing raise it."""

    def __init__(self) -> None:
        self.fail: Exception | None = None
        self.released: list[str] = []

    async def route(self, req: router_pb2.RouteRequest) -> router_pb2.RouteResponse:
        if self.fail is not None:
            raise self.fail
        return router_pb2.RouteResponse(worker_id="w1", address="127.0.0.1:1")

    async def release(self, req: router_pb2.ReleaseRequest) -> None:
        self.released.append(req.request_id)


class ScriptedPostprocessor:
    """Streams ``steps``: GenerateResponses to send, an exception to raise where the stream breaks."""

    def __init__(self) -> None:
        self.steps: list = []

    async def generate(self, req: postprocessor_pb2.GenerateRequest):
        for step in self.steps:
            if isinstance(step, Exception):
                raise step
            yield [step]  # one ready response at a time


@pytest.fixture
async def gateway():
    card = ModelCard(MODEL, str(default_test_model_dir()), reasoning_parser="qwen3", tool_call_parser="hermes")
    router, post = ScriptedRouter(), ScriptedPostprocessor()
    pipeline = Pipeline(InProcessPreprocessor(Preprocessor(lambda name: card if name == MODEL else None)),
                        router, post)
    server = GrpcServer("gateway", "127.0.0.1", 0, grace_s=0)
    models = {MODEL: [WorkerCard("w1", "127.0.0.1:1", card)]}
    anthropic_pb2_grpc.add_AnthropicServiceServicer_to_server(AnthropicServicer(pipeline, lambda: models),
                                                              server.server)
    await server.start()
    channel = grpc.aio.insecure_channel(server.address)
    yield anthropic_pb2_grpc.AnthropicServiceStub(channel), router, post
    await channel.close()
    await server.stop()


def request(**kw) -> httpbody_pb2.HttpBody:
    body = {"model": MODEL, "max_tokens": 32, "messages": [{"role": "user", "content": "Hi"}], **kw}
    return httpbody_pb2.HttpBody(content_type="application/json", data=orjson.dumps(body))


def trailers(e: grpc.aio.AioRpcError) -> dict[str, str]:
    return {k: v for k, v in e.trailing_metadata() or () if isinstance(v, str)}


async def test_mid_stream_failure_is_an_anthropic_error_event(gateway):
    stub, router, post = gateway
    post.steps = [postprocessor_pb2.GenerateResponse(text="Hel", completion_tokens=1, prompt_tokens=9),
                  postprocessor_pb2.GenerateResponse(text="lo", completion_tokens=1),
                  WorkerFailed("The worker failed while generating this response")]
    raw = b"".join([body.data async for body in stub.CreateMessage(request(stream=True))])
    frames = [f.split(b"\n") for f in raw.split(b"\n\n") if f]
    names = [f[0].removeprefix(b"event: ").decode() for f in frames]
    assert names == ["message_start", "content_block_start", "content_block_delta", "content_block_delta",
                     "error"]
    assert orjson.loads(frames[-1][1].removeprefix(b"data: ")) == {
        "type": "error", "error": {"type": "api_error",
                                   "message": "The worker failed while generating this response"}}
    assert b"message_stop" not in raw and b"[DONE]" not in raw
    assert len(router.released) == 1  # the booking is freed even though the stream broke


async def test_overload_before_the_first_byte_is_529_with_retry_after(gateway):
    stub, router, _ = gateway
    router.fail = Overloaded("All workers are busy, please retry later")
    with pytest.raises(grpc.aio.AioRpcError) as e:
        [body async for body in stub.CreateMessage(request(stream=True))]
    t = trailers(e.value)
    assert t["x-meshfront-status"] == "529" and t["x-meshfront-retry-after"] == "1"
    assert orjson.loads(t["x-meshfront-body"])["error"]["type"] == "overloaded_error"


async def test_a_bug_is_a_500_api_error_in_anthropics_shape(gateway):
    stub, router, _ = gateway
    router.fail = RuntimeError("a bug, with internals the client must not see")
    with pytest.raises(grpc.aio.AioRpcError) as e:
        [body async for body in stub.CreateMessage(request())]
    t = trailers(e.value)
    assert t["x-meshfront-status"] == "500"
    assert orjson.loads(t["x-meshfront-body"]) == {
        "type": "error", "error": {"type": "api_error", "message": "internal error in the gateway"}}


async def test_count_tokens_errors_carry_anthropics_trailers(gateway):
    stub, _, _ = gateway
    body = orjson.dumps({"model": "nope", "messages": [{"role": "user", "content": "Hi"}]})
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.CountTokens(httpbody_pb2.HttpBody(content_type="application/json", data=body))
    t = trailers(e.value)
    assert t["x-meshfront-status"] == "404"
    assert orjson.loads(t["x-meshfront-body"])["error"]["type"] == "not_found_error"
    ok = await stub.CountTokens(httpbody_pb2.HttpBody(
        content_type="application/json",
        data=orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]})))
    assert orjson.loads(ok.data)["input_tokens"] > 3
