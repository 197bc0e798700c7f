"""The transport-free Preprocessor: proto in, proto out, with a fixed model lookup."""

from __future__ import annotations

import json

import pytest
from meshfront.common.v1 import common_pb2
from meshfront.preprocessor.v1 import preprocessor_pb2

from services.common.discovery import ModelCard
from services.common.errors import Internal, InvalidRequest, ModelNotFound
from services.common.hashing import block_hashes
from services.preprocessor.core.artifacts import ArtifactCache
from services.preprocessor.service import Preprocessor

pytestmark = pytest.mark.unit

MESSAGES = [{"role": "user", "content": "Tell me a story about a robot. " * 4}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture(scope="module")
def cache():
    return ArtifactCache()


def make(demo_model_dir, cache, **card_fields) -> Preprocessor:
    card = ModelCard(name="demo", model_dir=str(demo_model_dir), tool_call_parser="hermes", reasoning_parser="qwen3",
                     **card_fields)
    return Preprocessor({"demo": card}.get, cache)


def chat_request(**stop) -> preprocessor_pb2.PreprocessRequest:
    return preprocessor_pb2.PreprocessRequest(
        request=common_pb2.PreprocessedRequest(request_id="r1", model="demo", stop=common_pb2.StopConditions(**stop),
                                               sampling=common_pb2.SamplingOptions(temperature=0.5)),
        messages_json=json.dumps(MESSAGES), tools_json=json.dumps(TOOLS),
        tool_choice=common_pb2.ToolChoice(mode=common_pb2.TOOL_CHOICE_MODE_NAMED, function_name="f"))


async def test_chat(demo_model_dir, cache, hf_tokenizer):
    resp = await make(demo_model_dir, cache).preprocess(chat_request(stop=["END"]))
    expected = hf_tokenizer.apply_chat_template(MESSAGES, tools=TOOLS, tokenize=True, add_generation_prompt=True,
                                                return_dict=False)
    assert list(resp.request.token_ids) == list(expected)
    assert resp.request.request_id == "r1" and resp.request.model == "demo"
    assert resp.request.sampling.temperature == 0.5
    assert list(resp.request.stop.stop) == ["END"]
    assert list(resp.request.stop.stop_token_ids_hidden) == [151645, 151643]
    assert list(resp.request.eos_token_ids) == [151645, 151643]
    assert list(resp.block_hashes) == block_hashes(list(expected), 16)
    assert len(resp.block_hashes) == len(expected) // 16
    post = resp.postprocess
    assert post.model_dir == str(demo_model_dir)
    assert (post.tool_call_parser, post.reasoning_parser) == ("hermes", "qwen3")
    assert not post.prompt_opens_reasoning
    # Only what the preprocessor learnt from the model: the request's own options are the gateway's to add.
    assert post == common_pb2.PostprocessOptions(model_dir=str(demo_model_dir), tool_call_parser="hermes",
                                                 reasoning_parser="qwen3")


async def test_offloaded_preparation_gives_the_same_result(demo_model_dir, cache):
    inline = await make(demo_model_dir, cache).preprocess(chat_request())
    card = ModelCard(name="demo", model_dir=str(demo_model_dir), tool_call_parser="hermes", reasoning_parser="qwen3")
    offloaded = await Preprocessor({"demo": card}.get, cache, offload_threshold=0).preprocess(chat_request())
    assert offloaded == inline


async def test_ignore_eos_sends_no_eos_ids(demo_model_dir, cache):
    resp = await make(demo_model_dir, cache).preprocess(chat_request(ignore_eos=True))
    assert list(resp.request.eos_token_ids) == []
    assert list(resp.request.stop.stop_token_ids_hidden) == []
    assert resp.request.stop.ignore_eos


async def test_block_size_comes_from_the_card(demo_model_dir, cache):
    resp = await make(demo_model_dir, cache, block_size=4).preprocess(chat_request())
    assert list(resp.block_hashes) == block_hashes(list(resp.request.token_ids), 4)


async def test_completions_text_and_tokens(demo_model_dir, cache):
    pre = make(demo_model_dir, cache)
    base = common_pb2.PreprocessedRequest(model="demo", token_ids=[9, 9, 9])
    text = await pre.preprocess(preprocessor_pb2.PreprocessRequest(request=base, text="Hello world"))
    assert list(text.request.token_ids) == [9707, 1879]
    tokens = await pre.preprocess(preprocessor_pb2.PreprocessRequest(
        request=base, tokens=preprocessor_pb2.TokenIds(ids=list(range(40)))))
    assert list(tokens.request.token_ids) == list(range(40))
    assert list(tokens.block_hashes) == block_hashes(list(range(40)), 16)


async def test_unknown_model(demo_model_dir, cache):
    req = chat_request()
    req.request.model = "nope"
    with pytest.raises(ModelNotFound) as e:
        await make(demo_model_dir, cache).preprocess(req)
    assert e.value.message == "The model `nope` does not exist."
    assert e.value.param == "model"


async def test_registered_context_length_wins(demo_model_dir, cache):
    with pytest.raises(InvalidRequest, match="maximum context length is 10 tokens") as e:
        await make(demo_model_dir, cache, context_length=10).preprocess(chat_request())
    assert e.value.param == "messages"


async def test_max_tokens_beyond_the_window(demo_model_dir, cache):
    with pytest.raises(InvalidRequest, match="in the completion"):
        await make(demo_model_dir, cache).preprocess(chat_request(max_tokens=4096))


async def test_missing_prompt(demo_model_dir, cache):
    with pytest.raises(InvalidRequest, match="no prompt"):
        await make(demo_model_dir, cache).preprocess(
            preprocessor_pb2.PreprocessRequest(request=common_pb2.PreprocessedRequest(model="demo")))


async def test_too_many_stop_strings(demo_model_dir, cache):
    with pytest.raises(InvalidRequest) as e:
        await make(demo_model_dir, cache).preprocess(chat_request(stop=[str(i) for i in range(33)]))
    assert e.value.param == "stop"


async def test_unloadable_model_dir(tmp_path):
    pre = Preprocessor({"demo": ModelCard(name="demo", model_dir=str(tmp_path))}.get)
    with pytest.raises(Internal, match="cannot be loaded"):
        await pre.preprocess(chat_request())
    await pre.warm(ModelCard(name="demo", model_dir=str(tmp_path)))  # logs, does not raise


async def test_a_lora_adapter_request_names_its_adapter_and_salts_its_hashes(demo_model_dir, cache):
    from services.common.discovery import LoraAdapter

    card = ModelCard(name="demo", model_dir=str(demo_model_dir), lora_adapters=(LoraAdapter("ada", "/a/ada"),))
    pre = Preprocessor({"demo": card, "ada": card}.get, cache)  # discovery serves the adapter by its holders
    base = await pre.preprocess(chat_request())
    req = chat_request()
    req.request.model = "ada"
    lora = await pre.preprocess(req)
    assert list(lora.request.token_ids) == list(base.request.token_ids)  # the base model's tokenizer and template
    assert (lora.request.lora.name, lora.request.lora.path) == ("ada", "/a/ada")
    assert not base.request.HasField("lora")
    assert list(lora.block_hashes) == block_hashes(list(lora.request.token_ids), 16, lora_name="ada")
    assert set(lora.block_hashes).isdisjoint(base.block_hashes) and base.block_hashes


async def test_a_warmed_model_has_read_its_length_floor_from_the_vocabulary(demo_model_dir):
    """Read at the first long prompt instead, the vocabulary's copy held the GIL for ~200 ms and stalled every
    stream of the process (artifacts.read_length_floor)."""
    cache = ArtifactCache()  # its own: the module's may have been read by another test
    card = ModelCard(name="demo", model_dir=str(demo_model_dir))
    await Preprocessor({"demo": card}.get, cache).warm(card)
    artifacts = cache.get(str(demo_model_dir))
    assert {"bytes_per_token_ceiling", "space_split_kind"} <= artifacts.__dict__.keys()  # cached_property's slots
    assert artifacts.bytes_per_token_ceiling is not None  # the demo's byte-level BPE has a bound
