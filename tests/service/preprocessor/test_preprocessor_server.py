"""The preprocessor's gRPC server on 127.0.0.1:0 with a fixed model table (no NATS)."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from meshfront.common.v1 import common_pb2
from meshfront.preprocessor.v1 import preprocessor_pb2, preprocessor_pb2_grpc

from services.common.discovery import ModelCard
from services.common.errors import InvalidRequest, ModelNotFound, from_rpc_error
from services.common.grpc_server import CHANNEL_OPTIONS, GrpcServer
from services.common.hashing import block_hashes
from services.preprocessor.server import add_to_server
from services.preprocessor.service import Preprocessor

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]


@pytest.fixture
async def stub(demo_model_dir):
    cards = {"demo": ModelCard(name="demo", model_dir=str(demo_model_dir), context_length=64, block_size=4,
                               tool_call_parser="hermes", reasoning_parser="qwen3")}
    server = GrpcServer("preprocessor", "127.0.0.1", 0, grace_s=1.0)
    add_to_server(server, Preprocessor(cards.get))
    await server.start()
    async with grpc.aio.insecure_channel(server.address, options=CHANNEL_OPTIONS) as channel:
        yield preprocessor_pb2_grpc.PreprocessorServiceStub(channel)
    await server.stop()


def chat(model: str, content: str, **stop) -> preprocessor_pb2.PreprocessRequest:
    return preprocessor_pb2.PreprocessRequest(
        request=common_pb2.PreprocessedRequest(request_id="r", model=model, stop=common_pb2.StopConditions(**stop)),
        messages_json=json.dumps([{"role": "user", "content": content}]),
        chat_template_kwargs_json='{"enable_thinking": false}')


async def test_preprocess(stub):
    resp = await asyncio.wait_for(stub.Preprocess(chat("demo", "Hello there", max_tokens=8)), 30)
    ids = list(resp.request.token_ids)
    assert ids[:1] == [151644] and ids[-4:] == [151667, 271, 151668, 271]  # "<think>\n\n</think>\n\n"
    assert list(resp.block_hashes) == block_hashes(ids, 4)
    assert list(resp.request.eos_token_ids) == [151645, 151643]
    assert resp.postprocess.reasoning_parser == "qwen3"
    assert resp.request.stop.max_tokens == 8


async def test_unknown_model_is_not_found(stub):
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await asyncio.wait_for(stub.Preprocess(chat("nope", "hi")), 30)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    err = from_rpc_error(e.value)
    assert isinstance(err, ModelNotFound)
    assert (err.message, err.param) == ("The model `nope` does not exist.", "model")


async def test_context_overflow_is_invalid_argument(stub):
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await asyncio.wait_for(stub.Preprocess(chat("demo", "word " * 100)), 30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    err = from_rpc_error(e.value)
    assert isinstance(err, InvalidRequest)
    assert err.message.startswith("This model's maximum context length is 64 tokens. However, your messages resulted")
    assert (err.param, err.code) == ("messages", "context_length_exceeded")
