"""POST /v1/embeddings through Envoy with the official openai SDK: a real all-MiniLM-L6-v2 worker beside a
mocker chat model, in both shapes (split stages, and the all-in-one gateway)."""

from __future__ import annotations

import asyncio
import base64

import httpx
import numpy as np
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.common.tokenizer_files import load_tokenizer
from services.launcher.plan import WorkerSpec
from services.models.minilm import default_embedding_model_dir
from tests.conftest import sdk_client, stop_cleanly
from tests.mesh.conftest import DEMO, mocker, start_mesh

pytestmark = [pytest.mark.mesh, pytest.mark.timeout(300)]

EMBED = "sentence-transformers/all-MiniLM-L6-v2"


@pytest.fixture(scope="module", params=["split", "allinone"])
def embed_mesh(request, tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    workers = [mocker(demo_model_dir, DEMO), WorkerSpec(str(default_embedding_model_dir()), EMBED, "embed")]
    m = start_mesh(tmp_path_factory, workers, inproc=request.param == "allinone")
    yield m
    stop_cleanly(m)


@pytest.fixture
def client(embed_mesh):
    c = sdk_client(embed_mesh, timeout=60)
    yield c
    c.close()


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(default_embedding_model_dir())


def as_array(items) -> np.ndarray:
    return np.array([d.embedding for d in sorted(items, key=lambda d: d.index)], dtype=np.float32)


def test_a_string_input(client, tokenizer):
    text = "The quick brown fox jumps over the lazy dog."
    resp = client.embeddings.create(model=EMBED, input=text, encoding_format="float")
    assert resp.object == "list" and resp.model == EMBED and len(resp.data) == 1
    [item] = resp.data
    assert item.object == "embedding" and item.index == 0 and len(item.embedding) == 384
    assert resp.usage.prompt_tokens == resp.usage.total_tokens == len(tokenizer.encode(text).ids)
    assert abs(float(np.linalg.norm(item.embedding)) - 1.0) < 1e-4


def test_similar_sentences_are_closer_than_unrelated_ones(client):
    texts = ["How do I bake bread at home?", "What is a simple recipe for homemade bread?",
             "The central bank raised interest rates by half a point.",
             "Stock markets fell after the rate decision."]
    v = as_array(client.embeddings.create(model=EMBED, input=texts, encoding_format="float").data)
    sim = v @ v.T
    assert sim[0, 1] > sim[0, 2] + 0.3 and sim[0, 1] > sim[0, 3] + 0.3, sim
    assert sim[2, 3] > sim[2, 0] + 0.2 and sim[2, 3] > sim[2, 1] + 0.2, sim


def test_token_ids_embed_like_the_text_they_encode(client, tokenizer):
    texts = ["a first sentence", "and a second, longer sentence than the first"]
    ids = [tokenizer.encode(t).ids for t in texts]
    from_text = as_array(client.embeddings.create(model=EMBED, input=texts, encoding_format="float").data)
    from_ids = as_array(client.embeddings.create(model=EMBED, input=ids, encoding_format="float").data)
    single = as_array(client.embeddings.create(model=EMBED, input=ids[1], encoding_format="float").data)
    assert np.allclose(from_ids, from_text, atol=1e-5)
    assert np.allclose(single[0], from_text[1], atol=1e-5)


def test_base64_round_trips_to_the_same_floats(client, embed_mesh):
    texts = ["base64 is the SDK's default", "floats are the API's default"]
    floats = as_array(client.embeddings.create(model=EMBED, input=texts, encoding_format="float").data)
    # Without encoding_format the SDK asks for base64 and decodes it itself.
    decoded_by_sdk = as_array(client.embeddings.create(model=EMBED, input=texts).data)
    assert np.array_equal(decoded_by_sdk, floats)
    raw = httpx.post(f"{embed_mesh.url}/v1/embeddings", timeout=60,
                     json={"model": EMBED, "input": texts, "encoding_format": "base64"}).json()
    ours = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in raw["data"]])
    assert ours.shape == (2, 384) and np.array_equal(ours, floats)


def test_dimensions_the_model_cannot_produce_are_a_400(client):
    ok = client.embeddings.create(model=EMBED, input="x", dimensions=384, encoding_format="float")
    assert len(ok.data[0].embedding) == 384
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=EMBED, input="x", dimensions=128)
    assert e.value.status_code == 400 and e.value.body["param"] == "dimensions"
    assert "384" in e.value.body["message"]


def test_an_input_past_the_models_maximum_length_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=EMBED, input=["short", "word " * 300])
    assert e.value.body["param"] == "input" and e.value.body["code"] == "context_length_exceeded"
    assert "input[1]" in e.value.body["message"]


def test_unknown_fields_are_a_400_naming_them(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=EMBED, input="x", extra_body={"truncate_prompt_tokens": 10})
    assert e.value.body["param"] == "truncate_prompt_tokens"


def test_chat_to_the_embedding_model_and_embeddings_to_the_chat_model_are_400s(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=EMBED, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert e.value.body["param"] == "model" and "/v1/embeddings" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=EMBED, prompt="hi", max_tokens=4)
    assert e.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=DEMO, input="hi")
    assert e.value.body["param"] == "model" and "not an embedding model" in e.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="no-such-model", input="hi")
    # The chat model still chats.
    reply = client.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert reply.choices[0].message.content is not None


def test_models_lists_the_embedding_model(client):
    ids = {m.id for m in client.models.list().data}
    assert {EMBED, DEMO} <= ids
    assert client.models.retrieve(EMBED).id == EMBED


def batch_histogram(mesh) -> tuple[float, float]:
    """(forward passes, inputs) so far, from the embedding worker's ``embed_batch_inputs`` histogram."""
    [name] = [n for n in mesh.plan.metrics_ports if n.startswith("embed-")]
    text = httpx.get(f"http://127.0.0.1:{mesh.plan.metrics_ports[name]}/metrics", timeout=5).text
    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name.startswith("meshfront_worker_embed_batch_inputs")}
    return samples["meshfront_worker_embed_batch_inputs_count"], samples["meshfront_worker_embed_batch_inputs_sum"]


async def test_concurrent_requests_are_batched_and_all_get_their_own_embeddings(embed_mesh):
    passes_before, inputs_before = batch_histogram(embed_mesh)
    async with openai.AsyncOpenAI(base_url=f"{embed_mesh.url}/v1", api_key="unused", max_retries=0,
                                  timeout=120) as aclient:
        texts = [f"request number {i} is about {['cats', 'finance', 'weather', 'music'][i % 4]}" for i in range(32)]
        results = await asyncio.gather(*(aclient.embeddings.create(model=EMBED, input=t, encoding_format="float")
                                         for t in texts))
        together = (await aclient.embeddings.create(model=EMBED, input=texts, encoding_format="float")).data
    assert np.allclose(np.stack([as_array(r.data)[0] for r in results]), as_array(together), atol=1e-5)
    passes, inputs = batch_histogram(embed_mesh)
    assert inputs - inputs_before == 64  # 32 single-input requests, then one of 32 inputs
    # The 32 concurrent requests shared forward passes (the 32-input request takes one more).
    assert passes - passes_before < 32, (passes - passes_before)
