"""Bad inputs through Envoy with the official clients (issue 23): each is a 400 (INVALID_ARGUMENT on KServe)
naming the field, never a 503, a template's error text or a prompt tokenized for half a minute.

Uses the session ``mesh`` (mocker workers for the demo model, whose context window is 4,096 tokens), and
a mesh of its own for the embedding model (all-MiniLM-L6-v2, inputs up to 256 tokens).
"""

from __future__ import annotations

import struct
import time

import anthropic
import grpc
import openai
import pytest

from services.launcher.plan import WorkerSpec
from services.models.minilm import default_embedding_model_dir
from tests.conftest import require_module, sdk_client, stop_cleanly
from tests.mesh.conftest import DEMO, start_mesh

require_module("tritonclient")
import tritonclient.grpc as triton  # noqa: E402

pytestmark = pytest.mark.mesh

HI = [{"role": "user", "content": "hi"}]
TEN_MB = 10 * 2**20


@pytest.fixture
def claude(mesh):
    c = anthropic.Anthropic(base_url=mesh.url, api_key="unused", max_retries=0, timeout=30)
    yield c
    c.close()


def _printable(text: str) -> bool:
    return all(c.isprintable() for c in text)


def test_a_pin_to_a_worker_that_does_not_serve_the_model_is_a_400_naming_the_field(client, claude):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=DEMO, messages=HI, max_tokens=2,
                                       extra_body={"nvext": {"backend_instance_id": 987654321}})
    assert e.value.body["param"] == "nvext.backend_instance_id"
    assert "987654321" in e.value.body["message"] and "does not serve model" in e.value.body["message"]
    with pytest.raises(anthropic.BadRequestError) as a:
        claude.messages.create(model=DEMO, max_tokens=2, messages=HI,
                               extra_headers={"x-worker-instance-id": "987654321"})
    assert "does not serve model" in a.value.message


def test_a_pin_with_control_characters_is_refused_without_echoing_them(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=DEMO, prompt="hi", max_tokens=2,
                                  extra_body={"nvext": {"backend_instance_id": "w\r\nx-evil: 1\x1b[31m"}})
    assert e.value.body["param"] == "nvext.backend_instance_id" and _printable(e.value.body["message"])


def test_a_malformed_tool_call_is_a_400_naming_its_path_not_a_template_error(client):
    history = [*HI, {"role": "assistant", "content": None, "tool_calls": [{"id": 5, "function": "f"}]},
               {"role": "tool", "tool_call_id": "5", "content": "ok"}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=DEMO, messages=history, max_tokens=2)
    assert e.value.body["param"] == "messages[1].tool_calls[0].id"
    history[1]["tool_calls"] = [{"id": "c1", "type": "function", "function": "f"}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=DEMO, messages=history, max_tokens=2)
    assert e.value.body["param"] == "messages[1].tool_calls[0].function"
    assert "template" not in e.value.body["message"] and "str object" not in e.value.body["message"]


def test_a_message_name_that_is_a_number_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": "hi", "name": 7}],
                                       max_tokens=2)
    assert e.value.body["param"] == "messages[0].name"


def test_an_anthropic_tool_result_for_no_tool_use_is_a_400(claude):
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model=DEMO, max_tokens=2, messages=[
            *HI, {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "ok"}]}])
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert "messages[2].content[0].tool_use_id" in e.value.message


def test_a_kserve_input_with_contents_and_raw_input_contents_is_invalid_argument_naming_it(mesh):
    request = triton.service_pb2.ModelInferRequest(model_name=DEMO)
    tensor = request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    tensor.contents.bytes_contents.append(b"typed")
    request.raw_input_contents.append(struct.pack("<I", 3) + b"raw")
    with grpc.insecure_channel(mesh.grpc_target) as channel:
        stub = triton.service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelInfer(request, timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'text_input'" in e.value.details() and "raw_input_contents" in e.value.details()


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_a_10_mb_prompt_is_refused_in_moments(client, api):
    text = "The quick brown fox. " * (TEN_MB // 21)
    started = time.monotonic()
    with pytest.raises(openai.BadRequestError) as e:
        if api == "chat":
            client.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": text}], max_tokens=2)
        else:
            client.completions.create(model=DEMO, prompt=text, max_tokens=2)
    elapsed = time.monotonic() - started
    assert e.value.body["code"] == "context_length_exceeded"
    # It was 16-30 s of tokenizing; now the byte floor answers. Loose: 10 MB still crosses every hop.
    assert elapsed < 8, elapsed


EMBED = "sentence-transformers/all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def embed_mesh(tmp_path_factory, envoy_bin, nats_bin):
    m = start_mesh(tmp_path_factory, [WorkerSpec(str(default_embedding_model_dir()), EMBED, "embed")])
    yield m
    stop_cleanly(m)


def test_a_10_mb_embeddings_input_is_refused_in_moments(embed_mesh):
    text = "The quick brown fox. " * (TEN_MB // 21)
    client = sdk_client(embed_mesh, timeout=30)
    try:
        started = time.monotonic()
        with pytest.raises(openai.BadRequestError) as e:
            client.embeddings.create(model=EMBED, input=["short", text])
        elapsed = time.monotonic() - started
        assert e.value.body["code"] == "context_length_exceeded" and "input[1]" in e.value.body["message"]
        assert elapsed < 8, elapsed  # encoding it took 16.7 s (WordPiece has no byte floor; it splits at spaces)
        assert len(client.embeddings.create(model=EMBED, input="a" * 100_000).data[0].embedding) == 384
    finally:
        client.close()
