"""The gateway's API switches on real gRPC servers at 127.0.0.1:0: the Anthropic API and KServe off, and
the billing-preamble strip measured by the real preprocessor (the demo model's template and tokenizer).

Calls go through the generated stubs and tritonclient, as Envoy's transcoder and KServe clients make them;
the trailers Envoy's Lua filter turns into the HTTP status and body are checked. The router and
postprocessor are stand-ins that fail the test if called: neither switch may start any generation.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import grpc
import orjson
import pytest
from google.api import httpbody_pb2
from meshfront.gateway.v1 import anthropic_pb2_grpc

from services.allinone.clients import InProcessPreprocessor
from services.common.discovery import ModelCard, WorkerCard
from services.common.grpc_server import GrpcServer
from services.gateway.anthropic.server import AnthropicServicer
from services.gateway.core.pipeline import Pipeline
from services.gateway.kserve.server import KServeServicer, add_to_server
from services.models import default_test_model_dir
from services.preprocessor.service import Preprocessor
from tests.conftest import require_module

pytestmark = pytest.mark.service

MODEL = "switches-demo"
BILLING = "x-anthropic-billing-header: cc_version=2.1.3.a1b; cc_entrypoint=cli; cch=0f3e9;"
CARD = ModelCard(MODEL, str(default_test_model_dir()))
MODELS = {MODEL: [WorkerCard("w1", "127.0.0.1:1", CARD)]}


class NeverCalled:
    """The router and postprocessor: a switch that is off, or a token count, must not reach them."""

    def __getattr__(self, name: str):
        raise AssertionError(f"the {name} of a stage was reached")


def pipeline() -> Pipeline:
    return Pipeline(InProcessPreprocessor(Preprocessor(lambda name: CARD if name == MODEL else None)),
                    NeverCalled(), NeverCalled())


@contextlib.asynccontextmanager
async def anthropic_stub(**switches) -> AsyncIterator[anthropic_pb2_grpc.AnthropicServiceStub]:
    server = GrpcServer("gateway", "127.0.0.1", 0, grace_s=0)
    anthropic_pb2_grpc.add_AnthropicServiceServicer_to_server(
        AnthropicServicer(pipeline(), lambda: MODELS, **switches), server.server)
    await server.start()
    channel = grpc.aio.insecure_channel(server.address)
    try:
        yield anthropic_pb2_grpc.AnthropicServiceStub(channel)
    finally:
        await channel.close()
        await server.stop()


def body(**kw) -> httpbody_pb2.HttpBody:
    return httpbody_pb2.HttpBody(content_type="application/json", data=orjson.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], **kw}))


async def test_anthropic_api_off_is_a_404_in_anthropics_shape_naming_the_flag():
    async with anthropic_stub(enabled=False) as stub:
        for call in (lambda: stub.CountTokens(body()),
                     lambda: anext(aiter(stub.CreateMessage(body(max_tokens=8, stream=True))))):
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await call()
            assert e.value.code() == grpc.StatusCode.NOT_FOUND
            trailers = {k: v for k, v in e.value.trailing_metadata() or () if isinstance(v, str)}
            assert trailers["x-meshfront-status"] == "404"
            error = orjson.loads(trailers["x-meshfront-body"])
            assert error["type"] == "error" and error["error"]["type"] == "not_found_error"
            assert "--enable-anthropic-api" in error["error"]["message"]
            assert "DYN_ENABLE_ANTHROPIC_API" in error["error"]["message"]


async def count(stub: anthropic_pb2_grpc.AnthropicServiceStub, system) -> int:
    reply = await stub.CountTokens(body(system=system))
    return orjson.loads(reply.data)["input_tokens"]


async def test_the_billing_line_costs_no_tokens_when_stripped_and_some_when_not():
    claude_code = [{"type": "text", "text": BILLING}, {"type": "text", "text": "You are a coding agent."}]
    async with anthropic_stub() as stripping:  # the default
        plain = await count(stripping, "You are a coding agent.")
        assert await count(stripping, claude_code) == plain
        assert await count(stripping, f"\n{BILLING}\nYou are a coding agent.") == plain
    async with anthropic_stub(strip_preamble=False) as keeping:
        assert await count(keeping, "You are a coding agent.") == plain
        assert await count(keeping, claude_code) > plain + 10  # the line's tokens are in the prompt


async def test_kserve_off_answers_unimplemented_naming_the_flag():
    require_module("tritonclient")
    import numpy as np
    import tritonclient.grpc.aio as triton_aio
    from tritonclient.grpc import InferInput
    from tritonclient.utils import InferenceServerException

    server = GrpcServer("gateway", "127.0.0.1", 0, grace_s=0)
    add_to_server(KServeServicer(pipeline(), lambda: MODELS), server.server, enabled=False)
    await server.start()
    client = triton_aio.InferenceServerClient(server.address)
    try:
        text = InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([b"Hi"], dtype=np.object_))
        for call in (client.is_server_live, lambda: client.get_model_metadata(MODEL),
                     lambda: client.infer(MODEL, [text])):
            with pytest.raises(InferenceServerException) as e:
                await call()
            assert e.value.status() == "StatusCode.UNIMPLEMENTED"
            assert "--kserve-grpc-server" in e.value.message() and "DYN_KSERVE_GRPC_SERVER" in e.value.message()

        async def one_request():
            yield {"model_name": MODEL, "inputs": [text]}
        with pytest.raises(grpc.aio.AioRpcError) as stream_error:  # tritonclient's aio stream raises grpc's own
            async for _ in client.stream_infer(one_request()):
                pass
        assert stream_error.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "--kserve-grpc-server" in (stream_error.value.details() or "")
    finally:
        await client.close()
        await server.stop()
