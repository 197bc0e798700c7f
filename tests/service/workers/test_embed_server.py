"""The embedding worker (all-MiniLM-L6-v2 on the CPU) behind a real gRPC server on a loopback port."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest
from meshfront.common.v1 import common_pb2
from meshfront.worker.v1 import worker_pb2, worker_pb2_grpc

from services.common.errors import from_rpc_error
from services.common.grpc_server import CHANNEL_OPTIONS
from services.common.tokenizer_files import load_tokenizer
from services.models.minilm import default_embedding_model_dir
from services.workers.embed.config import parse_config
from services.workers.embed.main import build_service
from services.workers.embed.server import build_server, embedding_card
from tests.conftest import require_module

require_module("torch")

pytestmark = [pytest.mark.service, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
async def embed_worker():
    model_dir = default_embedding_model_dir()
    cfg = parse_config(["--model-dir", str(model_dir), "--port", "0", "--no-register", "--model-name", "minilm"],
                       env={})
    service = build_service(cfg)
    server = build_server(cfg.worker, service)
    server.grace_s = 0
    service.batcher.start()
    await server.start()
    channel = grpc.aio.insecure_channel(server.address, options=CHANNEL_OPTIONS)
    yield worker_pb2_grpc.WorkerServiceStub(channel), service, cfg, load_tokenizer(model_dir)
    await channel.close()
    await server.stop()
    await service.batcher.close()


def request(*inputs: list[int], dimensions: int | None = None) -> worker_pb2.EmbedRequest:
    return worker_pb2.EmbedRequest(request_id="t", model="minilm", dimensions=dimensions,
                                   inputs=[worker_pb2.EmbedInput(token_ids=ids) for ids in inputs])


def vectors(resp: worker_pb2.EmbedResponse) -> np.ndarray:
    return np.stack([np.frombuffer(e, dtype="<f4") for e in resp.embeddings])


async def test_similar_sentences_are_closer_than_unrelated_ones(embed_worker):
    stub, _, _, tok = embed_worker
    texts = ["A man is playing a guitar.", "Someone strums a guitar.", "The stock market fell sharply today."]
    ids = [tok.encode(t).ids for t in texts]
    resp = await asyncio.wait_for(stub.Embed(request(*ids)), 60)
    v = vectors(resp)
    assert v.shape == (3, 384) and resp.dimensions == 384
    assert resp.prompt_tokens == sum(map(len, ids))
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)  # the model's Normalize module
    related, unrelated = float(v[0] @ v[1]), float(v[0] @ v[2])
    assert related > 0.5 > unrelated + 0.3, (related, unrelated)


async def test_concurrent_calls_share_forward_passes_and_get_their_own_vectors(embed_worker):
    stub, service, _, tok = embed_worker
    texts = [f"sentence number {i} about topic {i % 5}" for i in range(32)]
    alone = vectors(await stub.Embed(request(*[tok.encode(t).ids for t in texts])))
    before = sum(n for size, n in service.batcher.batch_sizes.items())
    results = await asyncio.wait_for(
        asyncio.gather(*(stub.Embed(request(tok.encode(t).ids)) for t in texts)), 60)
    batches = sum(n for size, n in service.batcher.batch_sizes.items()) - before
    assert batches < len(texts), "32 concurrent calls should not take 32 forward passes"
    together = np.concatenate([vectors(r) for r in results])
    # Padding is masked out: an input's vector does not depend on what it was batched with.
    assert np.allclose(together, alone, atol=1e-5)


async def test_dimensions_other_than_the_models_own_are_a_400_naming_dimensions(embed_worker):
    stub, _, _, tok = embed_worker
    ok = await stub.Embed(request(tok.encode("hi").ids, dimensions=384))
    assert ok.dimensions == 384
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.Embed(request(tok.encode("hi").ids, dimensions=64))
    err = from_rpc_error(e.value)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and err.param == "dimensions"


async def test_too_long_or_out_of_vocabulary_inputs_are_a_400_naming_input(embed_worker):
    stub, _, _, _ = embed_worker
    for bad in ([101] + [1000] * 300 + [102], [101, 40000, 102]):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.Embed(request(bad))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and from_rpc_error(e.value).param == "input"


async def test_generate_is_unimplemented_and_the_card_says_embeddings(embed_worker):
    stub, _, cfg, _ = embed_worker
    call = stub.Generate(worker_pb2.GenerateRequest(request=common_pb2.PreprocessedRequest(token_ids=[1])))
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call.read()
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    card = embedding_card(cfg.worker, "127.0.0.1:1")
    assert card.model.endpoints == ("embeddings",) and card.model.is_embedding
    assert card.model.context_length == 256 and card.kind == "embed"
