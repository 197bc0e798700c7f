"""The postprocessor in front of stock engines over SMG's engine proto: a real postprocessor server whose worker
client is the one production builds (engine_client.py's switch, by the card's engine_protocol), and two fake vLLM
engines, real grpc.aio servers implementing the package's ``VllmEngine`` service from its generated stubs (a
fake: we ship no engine). Streaming, finish reason and usage; a cancel the engine sees as Abort; an engine that
dies mid-stream, whose request migrates to the other one; a request the proto cannot carry refused before any
call; and embeddings through the engine's Embed."""

from __future__ import annotations

import asyncio
import uuid

import grpc
import numpy as np
import pytest
from meshfront.common.v1 import common_pb2
from meshfront.postprocessor.v1 import postprocessor_pb2, postprocessor_pb2_grpc
from meshfront.worker.v1 import worker_pb2
from smg_grpc_proto import vllm_engine_pb2 as pb
from smg_grpc_proto import vllm_engine_pb2_grpc

from services.common.cards import VLLM_ENGINE, ModelCard, WorkerCard
from services.common.engine_channels import CardsByAddress
from services.common.errors import InvalidRequest
from services.common.grpc_server import GrpcServer
from services.gateway.embeddings.worker_client import GrpcEmbedWorker
from services.models.qwen import EOS_TOKEN_IDS
from services.postprocessor.engine_client import ByProtocolWorkerClient, EngineWorkerClient
from services.postprocessor.migration import Migrator
from services.postprocessor.mux_client import MuxWorkerClient
from services.postprocessor.server import PostprocessorServicer
from services.postprocessor.service import Postprocessor
from services.router.service import Router

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]

PROMPT = [151644, 77091, 198]  # <|im_start|>assistant\n
MODEL = "m-engine-grpc"
DIE, HANG = "die", "hang"


def chunk(ids: list[int], cached: int = 0) -> pb.GenerateResponse:
    return pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=ids, prompt_tokens=len(PROMPT),
                                                            cached_tokens=cached, completion_tokens=len(ids)))


def complete(reason: str, matched: int | None = None, ids: tuple[int, ...] = ()) -> pb.GenerateResponse:
    done = pb.GenerateComplete(finish_reason=reason, prompt_tokens=len(PROMPT), output_ids=ids)
    if matched is not None:
        done.matched_token_id = matched
    return pb.GenerateResponse(complete=done)


class FakeEngine(vllm_engine_pb2_grpc.VllmEngineServicer):
    """Plays a script per request: responses, pauses (seconds), DIE (UNAVAILABLE mid-stream) or HANG."""

    def __init__(self) -> None:
        self.scripts: dict[str, list] = {}
        self.received: list[pb.GenerateRequest] = []
        self.aborted: list[str] = []

    async def Generate(self, request, context):
        self.received.append(request)
        for step in self.scripts[request.request_id.rsplit("-", 1)[0]]:
            if step == DIE:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "engine core died")
            elif step == HANG:
                await asyncio.sleep(60)
            elif isinstance(step, float):
                await asyncio.sleep(step)
            else:
                yield step

    async def Embed(self, request, context):
        ids = list(request.tokenized.input_ids)
        return pb.EmbedResponse(embedding=[float(ids[0]), -0.5, 0.25], prompt_tokens=len(ids), embedding_dim=3)

    async def Abort(self, request, context):
        self.aborted.extend(request.request_ids)
        return pb.AbortResponse()


@pytest.fixture(scope="module")
async def mesh():
    """(postprocessor stub, engines, their addresses)."""
    engines, servers, addresses = [FakeEngine(), FakeEngine()], [], []
    for engine in engines:
        engine_server = grpc.aio.server()
        vllm_engine_pb2_grpc.add_VllmEngineServicer_to_server(engine, engine_server)
        addresses.append(f"127.0.0.1:{engine_server.add_insecure_port('127.0.0.1:0')}")
        await engine_server.start()
        servers.append(engine_server)
    cards = [WorkerCard(f"e{i}", address, ModelCard(MODEL, "/m", context_length=512), kind="vllm",
                        engine_protocol=VLLM_ENGINE) for i, address in enumerate(addresses)]
    by_address = CardsByAddress()
    for card in cards:
        by_address.changed(card.worker_id, card)  # as the registry's listener is told
    router = Router(lambda model: [c for c in cards if c.model.name == model])
    own, engine_client = MuxWorkerClient(), EngineWorkerClient()
    postprocessor = Postprocessor(ByProtocolWorkerClient(own, engine_client, by_address), idle_timeout_s=0,
                                  migrator=Migrator(router, limit=3))
    server = GrpcServer("postprocessor", "127.0.0.1", 0, grace_s=0)
    postprocessor_pb2_grpc.add_PostprocessorServiceServicer_to_server(PostprocessorServicer(postprocessor),
                                                                      server.server)
    await server.start()
    async with grpc.aio.insecure_channel(server.address) as channel:
        yield postprocessor_pb2_grpc.PostprocessorServiceStub(channel), engines, addresses
    await server.stop()
    await postprocessor.close()
    await engine_client.close()
    await own.close()
    for s in servers:
        await s.stop(0)


def request(demo_model_dir, address: str, worker_id: str = "e0") -> postprocessor_pb2.GenerateRequest:
    req = postprocessor_pb2.GenerateRequest(worker_address=address, worker_id=worker_id)
    req.options.model_dir = str(demo_model_dir)
    req.request.request_id = uuid.uuid4().hex
    req.request.model = MODEL
    req.request.token_ids.extend(PROMPT)
    req.request.eos_token_ids.extend(EOS_TOKEN_IDS)
    req.request.stop.max_tokens = 16
    return req


async def test_a_stream_its_finish_reason_and_usage(mesh, demo_model_dir):
    stub, (engine, _), addresses = mesh
    req = request(demo_model_dir, addresses[0])
    # vLLM's servicer: the last delta again in the complete message, which the reader must not repeat.
    engine.scripts[req.request.request_id] = [chunk([9707], cached=2), chunk([11, 1879, EOS_TOKEN_IDS[0]]),
                                              complete("stop", EOS_TOKEN_IDS[0], (11, 1879, EOS_TOKEN_IDS[0]))]
    responses = [r async for r in stub.Generate(req)]
    assert "".join(r.text for r in responses) == "Hello, world"
    assert responses[-1].finish_reason == common_pb2.FINISH_REASON_EOS
    assert (responses[0].prompt_tokens, responses[0].cached_tokens) == (3, 2)
    assert sum(r.completion_tokens for r in responses) == 4
    sent = engine.received[-1]
    assert list(sent.tokenized.input_ids) == PROMPT and sent.stream
    assert sent.sampling_params.max_tokens == 16 and set(EOS_TOKEN_IDS) <= set(sent.sampling_params.stop_token_ids)


async def test_a_cancel_reaches_the_engine_as_abort(mesh, demo_model_dir):
    stub, (engine, _), addresses = mesh
    req = request(demo_model_dir, addresses[0])
    engine.scripts[req.request.request_id] = [chunk([9707]), HANG]
    call = stub.Generate(req)
    assert (await call.read()).text == "Hello"
    call.cancel()
    # The engine's id for this sequence (ours plus a call counter): other tests' calls may reach it meanwhile.
    [engine_id] = [r.request_id for r in engine.received if r.request_id.startswith(f"{req.request.request_id}-")]
    deadline = asyncio.get_running_loop().time() + 10
    while engine_id not in engine.aborted:
        assert asyncio.get_running_loop().time() < deadline, f"no Abort of {engine_id}: {engine.aborted}"
        await asyncio.sleep(0.01)


async def test_an_engine_that_dies_mid_stream_migrates_to_the_other(mesh, demo_model_dir):
    stub, (first, second), addresses = mesh
    req = request(demo_model_dir, addresses[0])
    first.scripts[req.request.request_id] = [chunk([9707]), 0.05, DIE]
    second.scripts[req.request.request_id] = [chunk([11, 1879]), complete("length")]
    responses = [r async for r in stub.Generate(req)]
    assert "".join(r.text for r in responses) == "Hello, world"
    assert responses[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert list(second.received[-1].tokenized.input_ids) == [*PROMPT, 9707]  # the continuation


async def test_what_the_proto_cannot_carry_is_a_400_before_any_call(mesh, demo_model_dir):
    stub, (engine, _), addresses = mesh
    req = request(demo_model_dir, addresses[0])
    req.request.lora.name, req.request.lora.path = "adapter", "/a"
    calls = len(engine.received)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        [r async for r in stub.Generate(req)]
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "LoRA" in (info.value.details() or "")
    assert len(engine.received) == calls



@pytest.mark.parametrize("engine_leg", ["prefill", "decode"])
async def test_a_disaggregated_route_with_an_engine_leg_is_a_400_before_any_call(mesh, demo_model_dir, engine_leg):
    """Whichever leg the engine would run; the other is our worker's address, where nothing listens: a call
    there would fail as a dead worker (503), not as a 400."""
    stub, (engine, _), addresses = mesh
    ours = "127.0.0.1:1"
    req = request(demo_model_dir, addresses[0] if engine_leg == "decode" else ours)
    req.prefill_worker_id, req.prefill_worker_address = "p", (addresses[0] if engine_leg == "prefill" else ours)
    calls = len(engine.received)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        [r async for r in stub.Generate(req)]
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "disaggregated" in (info.value.details() or "") and len(engine.received) == calls


async def test_embeddings_go_through_the_engines_embed(mesh):
    """The gateway's embedding client, switched by the card as the gateway builds it."""
    _, _, addresses = mesh
    cards = CardsByAddress()
    cards.changed("e0", WorkerCard("e0", addresses[0], ModelCard(MODEL, "/m"), engine_protocol=VLLM_ENGINE))
    client = GrpcEmbedWorker(None, cards)
    try:
        req = worker_pb2.EmbedRequest(request_id="emb", model=MODEL, inputs=[worker_pb2.EmbedInput(token_ids=[7, 8]),
                                                                              worker_pb2.EmbedInput(token_ids=[9])])
        reply = await client.embed(addresses[0], req)
        assert (reply.dimensions, reply.prompt_tokens) == (3, 3)
        assert [list(np.frombuffer(e, "<f4")) for e in reply.embeddings] == [[7.0, -0.5, 0.25], [9.0, -0.5, 0.25]]
        req.dimensions = 2
        with pytest.raises(InvalidRequest, match="dimensions"):
            await client.embed(addresses[0], req)
    finally:
        await client.close()
