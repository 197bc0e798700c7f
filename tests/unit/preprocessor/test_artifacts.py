"""Model-directory loading: templates, special tokens, EOS ids, context length."""

from __future__ import annotations

import pytest

from services.preprocessor.core.artifacts import ArtifactCache, ArtifactError, load_artifacts

pytestmark = pytest.mark.unit


def test_demo_model(artifacts, demo_model_dir):
    assert artifacts.eos_token_ids == (151645, 151643)
    assert artifacts.context_length == 4096
    assert artifacts.vocab_size == 151669
    assert artifacts.special_tokens == {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    assert artifacts.templates["default"] == (demo_model_dir / "chat_template.jinja").read_text()


def test_cache_loads_once(demo_model_dir):
    cache = ArtifactCache()
    assert cache.peek(str(demo_model_dir)) is None
    first = cache.get(str(demo_model_dir))
    assert cache.get(str(demo_model_dir)) is first
    assert cache.peek(str(demo_model_dir)) is first


def test_jinja_file_wins_over_json_and_tokenizer_config(load_variant):
    a = load_variant({"chat_template.jinja": "J", "chat_template.json": {"chat_template": "JSON"},
                      "tokenizer_config.json": {"chat_template": "TC"}})
    assert a.templates == {"default": "J"}


def test_chat_template_json_wins_over_tokenizer_config(load_variant):
    a = load_variant({"chat_template.json": {"chat_template": "JSON"},
                      "tokenizer_config.json": {"chat_template": "TC"}})
    assert a.templates == {"default": "JSON"}


def test_named_templates_pick_tool_use_when_tools_are_offered(load_variant):
    a = load_variant({"tokenizer_config.json": {"chat_template": [
        {"name": "default", "template": "plain"}, {"name": "tool_use", "template": "tools"}]}})
    assert a.template_for(has_tools=False) == "plain"
    assert a.template_for(has_tools=True) == "tools"


def test_no_template(load_variant):
    assert load_variant({}).template_for(has_tools=False) is None


def test_special_tokens_as_added_token_dicts(load_variant):
    a = load_variant({"tokenizer_config.json": {"bos_token": {"content": "<|endoftext|>", "special": True},
                                                "eos_token": "<|im_end|>", "unk_token": None}})
    assert a.special_tokens == {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"}


def test_eos_ids_merge_config_and_generation_config(load_variant):
    a = load_variant({"config.json": {"eos_token_id": 151645},
                      "generation_config.json": {"eos_token_id": [151643, 151645]}})
    assert a.eos_token_ids == (151645, 151643)


def test_eos_id_falls_back_to_the_eos_token(load_variant):
    a = load_variant({"tokenizer_config.json": {"eos_token": "<|im_end|>"}})
    assert a.eos_token_ids == (151645,)


@pytest.mark.parametrize(("config", "tokenizer_config", "expected"), [
    ({"max_position_embeddings": 2048}, {"model_max_length": 1024}, 2048),
    ({}, {"model_max_length": 1024}, 1024),
    ({}, {"model_max_length": 1000000000000000019884624838656}, 0),  # transformers' "no limit"
    ({}, {}, 0),
])
def test_context_length(load_variant, config, tokenizer_config, expected):
    a = load_variant({"config.json": config, "tokenizer_config.json": tokenizer_config})
    assert a.context_length == expected
    assert a.effective_context_length(0) == expected
    assert a.effective_context_length(512) == 512  # the worker's registration wins


def test_model_vocab_may_exceed_the_tokenizer(load_variant):
    assert load_variant({"config.json": {"vocab_size": 151936}}).vocab_size == 151936


def test_missing_tokenizer(tmp_path):
    with pytest.raises(ArtifactError, match="no tokenizer in .*none of tokenizer.json"):
        load_artifacts(str(tmp_path))


def test_broken_json(load_variant):
    with pytest.raises(ArtifactError, match="not valid JSON"):
        load_variant({"config.json": "{nope"})
