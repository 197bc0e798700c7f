"""POST /v1/embeddings at the gateway: request parsing, the response body and its base64 encoding."""

from __future__ import annotations

import base64

import numpy as np
import orjson
import pytest
from meshfront.worker.v1 import worker_pb2

from services.common.discovery import EMBEDDINGS, ModelCard, WorkerCard
from services.common.errors import InvalidRequest, NotFound
from services.gateway.embeddings.render import render
from services.gateway.embeddings.request import MAX_INPUTS, parse_embeddings
from services.gateway.front_door import check_model

pytestmark = pytest.mark.unit


def parse(**body):
    return parse_embeddings(orjson.dumps(body))


@pytest.mark.parametrize(("value", "inputs"), [
    ("hello", ["hello"]),
    (["a", "b"], ["a", "b"]),
    ([101, 7592, 102], [[101, 7592, 102]]),
    ([[101, 102], [101, 7592, 102]], [[101, 102], [101, 7592, 102]]),
    ([7.0], [[7]]),  # an integral float is the integer it is, as for completions prompts
])
def test_input_takes_every_openai_form(value, inputs):
    req = parse(model="m", input=value)
    assert req.inputs == inputs and req.encoding_format == "float" and req.dimensions is None


def test_the_optional_fields():
    req = parse(model="m", input="x", encoding_format="base64", dimensions=384, user="u-1")
    assert (req.encoding_format, req.dimensions, req.user) == ("base64", 384, "u-1")
    assert parse(model="m", input="x", dimensions=None, encoding_format=None).encoding_format == "float"


@pytest.mark.parametrize(("body", "param", "fragment"), [
    ({"input": "x"}, "model", "'model' is required"),
    ({"model": "m"}, "input", "'input' is required"),
    ({"model": "m", "input": ""}, "input", "'input' must not be an empty string"),
    ({"model": "m", "input": ["a", ""]}, "input", "'input[1]' must not be an empty string"),
    ({"model": "m", "input": []}, "input", "must be a non-empty string"),
    ({"model": "m", "input": ["a", [1]]}, "input", "must be a non-empty string"),
    ({"model": "m", "input": [{"text": "a"}]}, "input", "must be a non-empty string"),
    ({"model": "m", "input": [[]]}, "input", "'input[0]' must not be an empty list"),
    ({"model": "m", "input": [1, -2]}, "input", "token id 'input[1]'"),
    ({"model": "m", "input": [True]}, "input", "must be an integer"),
    ({"model": "m", "input": 5}, "input", "must be a non-empty string"),
    ({"model": "m", "input": ["a"] * (MAX_INPUTS + 1)}, "input", f"at most {MAX_INPUTS} inputs"),
    ({"model": "m", "input": "x", "encoding_format": "int8"}, "encoding_format", "must be one of float, base64"),
    ({"model": "m", "input": "x", "dimensions": 0}, "dimensions", "must be between 1 and"),
    ({"model": "m", "input": "x", "dimensions": "384"}, "dimensions", "must be an integer"),
    ({"model": "m", "input": "x", "user": 7}, "user", "must be a string"),
    ({"model": "m", "input": "x", "truncate": True}, "truncate", "Unsupported parameter(s): 'truncate'"),
])
def test_bad_requests_are_a_400_naming_the_field(body, param, fragment):
    with pytest.raises(InvalidRequest) as e:
        parse_embeddings(orjson.dumps(body))
    assert e.value.param == param and fragment in e.value.message, e.value.message


def test_a_body_that_is_not_a_json_object_is_a_400():
    for raw in (b"", b"[1]", b"{not json"):
        with pytest.raises(InvalidRequest):
            parse_embeddings(raw)


def response(*rows: list[float]) -> worker_pb2.EmbedResponse:
    return worker_pb2.EmbedResponse(embeddings=[np.array(r, dtype="<f4").tobytes() for r in rows],
                                    dimensions=len(rows[0]), prompt_tokens=7)


def test_float_and_base64_bodies_carry_the_same_float32_values():
    rows = [[0.1, -1 / 3, 2.5e-8], [1.0, 0.0, -0.75]]
    as_float = orjson.loads(render("m", response(*rows), "float"))
    as_base64 = orjson.loads(render("m", response(*rows), "base64"))
    assert as_float["object"] == "list" and as_float["model"] == "m"
    assert as_float["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    assert [d["index"] for d in as_float["data"]] == [0, 1] and as_float["data"][0]["object"] == "embedding"
    for f, b, row in zip(as_float["data"], as_base64["data"], rows, strict=True):
        decoded = np.frombuffer(base64.b64decode(b["embedding"]), dtype="<f4")
        assert decoded.tolist() == np.array(row, dtype=np.float32).tolist()
        # The JSON number is the shortest decimal that reads back as the very same float32.
        assert np.array(f["embedding"], dtype=np.float32).tolist() == decoded.tolist()
    assert as_float["data"][0]["embedding"][0] == 0.1  # not 0.10000000149011612


def test_the_model_must_exist_and_be_an_embedding_model():
    embed = WorkerCard("w1", "h:1", ModelCard("e", "/d", endpoints=(EMBEDDINGS,)), kind="embed")
    chat = WorkerCard("w2", "h:2", ModelCard("c", "/d"))
    models = {"e": [embed], "c": [chat]}
    check_model(models, "e", embedding=True)
    with pytest.raises(InvalidRequest, match="`c` is not an embedding model") as e:
        check_model(models, "c", embedding=True)
    assert e.value.param == "model"
    with pytest.raises(NotFound):
        check_model(models, "nope", embedding=True)
    # The same check guards the generating routes from an embedding model.
    check_model(models, "c")
    with pytest.raises(InvalidRequest, match="`e` is an embedding model; use /v1/embeddings"):
        check_model(models, "e")
