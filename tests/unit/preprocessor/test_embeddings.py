"""The preprocessor's embeddings path with the real all-MiniLM-L6-v2 tokenizer (no sockets)."""

from __future__ import annotations

import pytest
from meshfront.preprocessor.v1 import preprocessor_pb2

from services.common.discovery import EMBEDDINGS, ModelCard
from services.common.errors import InvalidRequest, ModelNotFound
from services.models.minilm import default_embedding_model_dir
from services.preprocessor.service import Preprocessor

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def preprocessor(demo_model_dir) -> Preprocessor:
    cards = {"minilm": ModelCard(name="minilm", model_dir=str(default_embedding_model_dir()), context_length=256,
                                 endpoints=(EMBEDDINGS,)),
             "chat": ModelCard(name="chat", model_dir=str(demo_model_dir))}
    return Preprocessor(cards.get)


def request(model: str, *inputs: str | list[int]) -> preprocessor_pb2.PreprocessEmbeddingsRequest:
    return preprocessor_pb2.PreprocessEmbeddingsRequest(request_id="r", model=model, inputs=[
        preprocessor_pb2.EmbeddingInput(text=x) if isinstance(x, str)
        else preprocessor_pb2.EmbeddingInput(tokens=preprocessor_pb2.TokenIds(ids=x)) for x in inputs])


async def test_text_gets_the_models_special_tokens_and_token_ids_are_kept_as_given(preprocessor):
    resp = await preprocessor.preprocess_embeddings(request("minilm", "The cat sits.", [101, 4937, 102], "hello"))
    ids = [list(t.ids) for t in resp.inputs]
    assert ids[0][0] == 101 and ids[0][-1] == 102 and len(ids[0]) == 6  # [CLS] the cat sits . [SEP]
    assert ids[1] == [101, 4937, 102]
    assert ids[2] == [101, 7592, 102]


async def test_an_input_past_the_maximum_length_is_a_400_not_a_truncation(preprocessor):
    fits = " ".join(["word"] * 254)  # 254 tokens + [CLS] + [SEP] = 256
    resp = await preprocessor.preprocess_embeddings(request("minilm", fits))
    assert len(resp.inputs[0].ids) == 256
    with pytest.raises(InvalidRequest) as e:
        await preprocessor.preprocess_embeddings(request("minilm", "short", fits + " word"))
    assert e.value.param == "input" and e.value.code == "context_length_exceeded"
    assert "'input[1]' resulted in 257 tokens" in e.value.message and "256" in e.value.message


@pytest.mark.parametrize(("inputs", "fragment"), [
    (("ok", ""), "'input[1]' must not be an empty string"),
    (([101, 30522, 102],), "token id 30522 in 'input[0]' is out of range"),
    (([],), "'input[0]' must not be an empty list"),
    ((), "'input' must not be empty"),
])
async def test_bad_inputs_are_a_400_naming_input(preprocessor, inputs, fragment):
    with pytest.raises(InvalidRequest) as e:
        await preprocessor.preprocess_embeddings(request("minilm", *inputs))
    assert e.value.param == "input" and fragment in e.value.message


async def test_the_model_kinds_do_not_mix(preprocessor):
    with pytest.raises(InvalidRequest, match="`chat` is not an embedding model") as e:
        await preprocessor.preprocess_embeddings(request("chat", "hi"))
    assert e.value.param == "model"
    chat = preprocessor_pb2.PreprocessRequest(text="hi")
    chat.request.model = "minilm"
    with pytest.raises(InvalidRequest, match="`minilm` is an embedding model; use /v1/embeddings") as e:
        await preprocessor.preprocess(chat)
    assert e.value.param == "model"
    with pytest.raises(ModelNotFound):
        await preprocessor.preprocess_embeddings(request("nope", "hi"))
