"""Each tokenizer format besides tokenizer.json, converted to tokenizers, against its own reference library:
tiktoken for ranks files, sentencepiece for SentencePiece models, transformers running the directory's class
for remote code; and which directories are refused, with one line."""

from __future__ import annotations

import random
import shutil

import pytest
import sentencepiece as spm
import tiktoken
from tiktoken.load import load_tiktoken_bpe

from services.common import model_files
from services.common.tokenizer_files import (
    TokenizerOptions,
    TokenizerUnavailable,
    find_source,
    load_encoder,
    load_tokenizer,
)
from services.common.tokenizer_kinds import sentencepiece_model, tiktoken_bpe
from services.models.tokenizer_models import (
    KIMI_PATTERN,
    MARKERS,
    build_tokenizer_model,
    corpus,
    train_sentencepiece,
)

TEXTS = ["Hello world! How's it going?  Lots   of spaces\n\n\ttabs", "日本語のテキスト、漢字とかな。東京",
         "emoji 🤖🎉👩‍👩‍👧 mixed 123456789 3.14159", "code: def f(x):\n    return x**2  # comment",
         "Ünïcödé façade naïve résumé ß", "   leading and trailing   ", "", "a", " ", "\n"]


def _random_texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    alphabet = "abcdefgh ijk\n\t日本東京🤖é'sXYZ0123.,!?"
    return [*TEXTS, *("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 120))) for _ in range(n))]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenizer-models")
    return {kind: build_tokenizer_model(kind, root / kind) for kind in ("tiktoken", "sentencepiece", "remote-code")}


def test_tiktoken_ids_equal_tiktoken(models):
    d = models["tiktoken"]
    ranks = load_tiktoken_bpe(str(d / "tiktoken.model"))
    reference = tiktoken.Encoding("ref", pat_str=KIMI_PATTERN, mergeable_ranks=ranks, special_tokens={})
    tok = load_tokenizer(d)
    for text in _random_texts(300, 1):
        ids = tok.encode(text, add_special_tokens=False).ids
        assert ids == reference.encode_ordinary(text), text
        assert tok.decode(ids) == text


def test_tiktoken_special_tokens_at_their_ids(models):
    tok = load_tokenizer(models["tiktoken"])
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False).ids
    assert ids[0] == 8192 and ids[-1] == 8193
    assert [tok.token_to_id(m) for m in MARKERS] == [8192, 8193, 8194, 8195]


def test_pattern_read_from_code_without_running_it():
    source = 'P = r"a+"\nclass T:\n    pat_str = "|".join([P, r"\\s+"]) + "|b"\n    def f(self): raise SystemExit\n'
    assert tiktoken_bpe.pattern_from_code(source) == r"a+|\s+|b"
    with pytest.raises(tiktoken_bpe.PatternNotFound, match="not a string made of literals"):
        tiktoken_bpe.pattern_from_code("import os\npat_str = os.environ['X']\n")
    with pytest.raises(tiktoken_bpe.PatternNotFound, match="no assignment"):
        tiktoken_bpe.pattern_from_code("x = 1\n")


def test_tiktoken_without_a_readable_pattern_is_refused(models, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(models["tiktoken"], d)
    (d / "tokenization_tiny_kimi.py").write_text("import os\npat_str = os.environ['PATTERN']\n")
    with pytest.raises(TokenizerUnavailable, match=r"no split pattern .*--trust-remote-code") as e:
        load_tokenizer(d)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
@pytest.mark.parametrize("byte_fallback", [True, False])
def test_sentencepiece_ids_equal_sentencepiece(tmp_path, model_type, byte_fallback):
    path = tmp_path / "tokenizer.model"
    path.write_bytes(train_sentencepiece(corpus(800), 600 if byte_fallback else 300, model_type=model_type,
                                         byte_fallback=byte_fallback))
    reference = spm.SentencePieceProcessor(model_file=str(path))
    tok = sentencepiece_model.to_tokenizer(path)
    for text in [*_random_texts(200, 2), "Bazo <|im_start|> kibu", "x<|im_end|>\nkibu<|im_start|>"]:
        ids = reference.encode(text)
        assert tok.encode(text, add_special_tokens=False).ids == ids, text
        assert tok.decode(ids) == reference.decode(ids), text
    # The one documented difference (sentencepiece_model.py): a text that starts with a user-defined piece.
    assert reference.encode("<|im_end|>x")[1:] == tok.encode("<|im_end|>x", add_special_tokens=False).ids


def test_sentencepiece_model_dir(models):
    d = models["sentencepiece"]
    assert find_source(d).kind == "sentencepiece"
    reference = spm.SentencePieceProcessor(model_file=str(d / "tokenizer.model"))
    tok = load_tokenizer(d)
    text = "Kaibo zoume 東京 🤖!"
    assert tok.encode(text, add_special_tokens=False).ids == reference.encode(text)


def test_remote_code_only_with_the_flag(models):
    d = models["remote-code"]
    with pytest.raises(TokenizerUnavailable, match=r"TinyRemoteTokenizer .* --trust-remote-code "
                                                   r"\(DYN_TRUST_REMOTE_CODE\)"):
        load_tokenizer(d)
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(d), trust_remote_code=True)
    tok = load_tokenizer(d, trust_remote_code=True)
    for text in _random_texts(50, 3):
        assert tok.encode(text, add_special_tokens=False).ids == reference.encode(text, add_special_tokens=False)


def test_tiktoken_class_under_trust_remote_code_encodes_as_the_class(models):
    from transformers import AutoTokenizer

    d = models["tiktoken"]
    reference = AutoTokenizer.from_pretrained(str(d), trust_remote_code=True)
    run = load_tokenizer(d, trust_remote_code=True)
    read = load_tokenizer(d)
    for text in _random_texts(50, 4):
        expected = reference.encode(text, add_special_tokens=False)
        assert run.encode(text, add_special_tokens=False).ids == expected == \
            read.encode(text, add_special_tokens=False).ids


def test_no_tokenizer_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(TokenizerUnavailable, match="none of tokenizer.json, tiktoken.model") as e:
        load_tokenizer(tmp_path)
    assert "\n" not in str(e.value)
    assert model_files.model_files_digest(tmp_path) == ""


def test_stage_files_carry_each_kind(models):
    files = model_files.read_stage_files(models["tiktoken"])
    assert {"tiktoken.model", "tokenization_tiny_kimi.py", "tokenizer_config.json"} <= set(files)
    assert "tokenization_tiny_remote.py" in model_files.read_stage_files(models["remote-code"])
    assert "tokenizer.model" in model_files.read_stage_files(models["sentencepiece"])
    assert all(model_files.model_files_digest(d) for d in models.values())
    assert model_files.is_stage_file("tokenization_kimi.py") and model_files.is_stage_file("o200k.tiktoken")
    assert not model_files.is_stage_file("../x.py") and not model_files.is_stage_file(".hidden.py")


def test_fastokens_encodes_as_tokenizers(models):
    d = models["tiktoken"]
    fast = load_encoder(d, TokenizerOptions(backend="fastokens", fallback=False))
    tok = load_tokenizer(d)
    import fastokens

    assert isinstance(fast, fastokens.Tokenizer)
    for text in _random_texts(100, 5):
        assert list(fast.encode(text, add_special_tokens=False).ids) == tok.encode(text, add_special_tokens=False).ids


def test_fastokens_falls_back_unless_told_not_to(models):
    d = models["sentencepiece"]  # a Unigram-free BPE, but with a Metaspace pre-tokenizer: whatever fastokens does,
    tok = load_tokenizer(d)  # the encoder it yields encodes as tokenizers or is tokenizers itself
    enc = load_encoder(d, TokenizerOptions(backend="fastokens"))
    text = "Kaibo zoume 東京 🤖!"
    assert list(enc.encode(text, add_special_tokens=False).ids) == tok.encode(text, add_special_tokens=False).ids
