"""The byte floor on token counts (services/preprocessor/core/byte_bound.py): a prompt whose byte length proves
it cannot fit is refused before it is tokenized, and the floor never refuses a prompt that fits."""

from __future__ import annotations

import functools
import json
import sys
import time
import unicodedata

import hypothesis
import hypothesis.strategies as st
import pytest
from meshfront.common.v1 import common_pb2
from meshfront.preprocessor.v1 import preprocessor_pb2
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers

from services.common.discovery import ModelCard
from services.common.errors import InvalidRequest
from services.preprocessor.core import embeddings, length_floor, prompt
from services.preprocessor.core.artifacts import ArtifactCache, load_artifacts
from services.preprocessor.core.byte_bound import BYTE_SYMBOLS, UNICODE_SHRINK, bytes_per_token_ceiling, fewest_tokens
from services.preprocessor.service import Preprocessor

pytestmark = pytest.mark.unit

TEN_MB = 10 * 2**20
# Texts that pack the most bytes into each Qwen token, and ones that normalisation (NFC) shrinks.
DENSE = [" " * 100_000, "-" * 50_000, "/" * 30_000 + "*" * 30_000, "\n" * 40_000, "ĠĠ" * 5_000,
         "\u1100\u1161\u11a8" * 20_000,  # Hangul jamo that NFC composes into one syllable (9 bytes -> 3)
         "\u03b9\u0308\u0301" * 20_000, "\U0001d7ce" * 20_000, "<|im_start|>" * 5_000, "\0" * 20_000 + "a"]


def _bytes(s: str) -> int:
    return len(s.encode())


def test_the_demo_tokenizer_has_a_floor_and_no_text_beats_it(artifacts):
    ceiling = artifacts.bytes_per_token_ceiling
    assert ceiling == 4.0 * 128  # NFC's factor times Qwen's longest token (128 spaces)
    for text in DENSE:
        assert len(prompt.encode(artifacts, text)) >= fewest_tokens(text, ceiling), text[:10]


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(text=st.text(min_size=1, max_size=3000))
def test_no_random_text_beats_the_floor(artifacts, text):
    # Against the longest token alone (no normalisation slack): tighter than the real ceiling, still sound
    # for text that NFC does not shrink, which random text almost never is.
    assert len(prompt.encode(artifacts, text)) >= fewest_tokens(text, artifacts.bytes_per_token_ceiling / 4)


def test_wordpiece_has_no_byte_floor_since_whitespace_and_long_words_collapse(minilm):
    tokenizer = minilm.tokenizer
    assert bytes_per_token_ceiling(tokenizer) is None
    assert len(tokenizer.encode("a" * 100_000).ids) == 3  # [CLS] [UNK] [SEP]: no byte count bounds the tokens


def _byte_level(**pipeline) -> Tokenizer:
    """A small byte-level BPE tokenizer (the 256 byte symbols and one merge) with ``pipeline``'s parts."""
    vocab = {symbol: i for i, symbol in enumerate(sorted(BYTE_SYMBOLS))}
    vocab["ĠĠ"] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab, [("Ġ", "Ġ")]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    for part, value in pipeline.items():
        setattr(tokenizer, part, value)
    return tokenizer


def test_a_small_byte_level_tokenizer_has_its_longest_token_as_ceiling():
    assert bytes_per_token_ceiling(_byte_level()) == 2.0
    assert bytes_per_token_ceiling(_byte_level(normalizer=normalizers.Sequence(
        [normalizers.NFKC(), normalizers.Lowercase()]))) == 2.0 * 5.0 * 4.0


@pytest.mark.parametrize("pipeline,why", [
    ({"normalizer": normalizers.Strip()}, "deletes leading and trailing whitespace"),
    ({"normalizer": normalizers.Replace(" ", "")}, "deletes"),
    ({"normalizer": normalizers.BertNormalizer()}, "deletes control characters"),
    ({"pre_tokenizer": pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.ByteLevel()])},
     "drops whitespace"),
    ({"pre_tokenizer": pre_tokenizers.Sequence([pre_tokenizers.Split("a", "removed"), pre_tokenizers.ByteLevel()])},
     "drops what it splits on"),
])
def test_pipelines_that_drop_text_have_no_floor(pipeline, why):
    assert bytes_per_token_ceiling(_byte_level(**pipeline)) is None, why


def test_an_added_token_that_absorbs_whitespace_or_truncation_means_no_floor():
    tokenizer = _byte_level()
    tokenizer.add_special_tokens([AddedToken("<mask>", lstrip=True)])
    assert bytes_per_token_ceiling(tokenizer) is None
    tokenizer = _byte_level()
    tokenizer.enable_truncation(16)
    assert bytes_per_token_ceiling(tokenizer) is None
    tokenizer = _byte_level()
    tokenizer.add_special_tokens(["<|a_long_special_token|>"])
    assert bytes_per_token_ceiling(tokenizer) == len("<|a_long_special_token|>")


def _most_shrink(form: str, decomposed_form: str) -> float:
    """The most input bytes per output byte ``form`` gives: single code points, and every canonically equivalent
    spelling of each composed character (pieces joined, each spelled by its longest code point)."""
    longest: dict[str, int] = {}
    worst = 1.0
    for cp in range(sys.maxunicode + 1):
        c = chr(cp)
        if 0xD800 <= cp <= 0xDFFF or (not unicodedata.decomposition(c) and not 0xAC00 <= cp <= 0xD7A3):
            continue  # a code point without a decomposition normalises to itself
        worst = max(worst, _bytes(c) / _bytes(unicodedata.normalize(form, c)))
        piece = unicodedata.normalize(decomposed_form, c)
        longest[piece] = max(longest.get(piece, _bytes(piece) if len(piece) == 1 else 0), _bytes(c))
    for piece in list(longest):
        composed = unicodedata.normalize(form, piece)
        if len(composed) != 1:
            continue

        @functools.cache
        def spelled(i: int, d: str = piece) -> int:  # the longest spelling of d[i:]
            if i == len(d):
                return 0
            return max(longest.get(d[i:j], _bytes(d[i:j]) if j == i + 1 else -10**9) + spelled(j)
                       for j in range(i + 1, len(d) + 1))
        worst = max(worst, spelled(0) / _bytes(composed))
    return worst


@pytest.mark.parametrize("form,decomposed", [("NFC", "NFD"), ("NFD", "NFD"), ("NFKC", "NFKD"), ("NFKD", "NFKD")])
def test_the_unicode_factors_bound_what_the_character_database_allows(form, decomposed):
    assert _most_shrink(form, decomposed) <= UNICODE_SHRINK[form]


def _request(text: str, **stop) -> preprocessor_pb2.PreprocessRequest:
    return preprocessor_pb2.PreprocessRequest(
        request=common_pb2.PreprocessedRequest(request_id="r", model="demo", stop=common_pb2.StopConditions(**stop)),
        text=text)


@pytest.fixture
def preprocessor(demo_model_dir):
    return Preprocessor({"demo": ModelCard(name="demo", model_dir=str(demo_model_dir))}.get, ArtifactCache())


@pytest.mark.parametrize("kind", ["text", "chat"])
async def test_a_10_mb_prompt_is_refused_before_it_is_tokenized(preprocessor, kind):
    req = _request("The quick brown fox. " * (TEN_MB // 21))
    if kind == "chat":
        req.messages_json = json.dumps([{"role": "user", "content": req.text}])
    await preprocessor.preprocess(_request("warm"))  # the model's artifacts load outside the clock
    started = time.process_time()  # CPU time of every thread: what a loaded machine's preemptions do not inflate
    with pytest.raises(InvalidRequest) as e:
        await preprocessor.preprocess(req)
    spent = time.process_time() - started
    assert e.value.code == "context_length_exceeded" and "cannot be fewer than" in e.value.message
    # Tokenizing it took 16-30 s of CPU (issue 23); the bound needs a render and a UTF-8 length.
    assert spent < 3.0, spent


async def test_the_floor_counts_the_completion_budget(preprocessor):
    text = " " * (512 * 3000)  # at least 3000 tokens by the floor (about 12,000 in fact)
    with pytest.raises(InvalidRequest) as e:
        await preprocessor.preprocess(_request(text, max_tokens=1500))
    assert "1500 more were requested" in e.value.message


async def test_a_large_prompt_that_fits_is_served(preprocessor, artifacts):
    text = " " * 480_000  # 480 KB in about 3,750 tokens of up to 128 spaces: fits 4,096
    resp = await preprocessor.preprocess(_request(text, max_tokens=8))
    assert len(resp.request.token_ids) == len(prompt.encode(artifacts, text)) < 4096


def test_an_embedding_input_is_refused_by_the_floor_before_any_is_encoded(artifacts):
    with pytest.raises(InvalidRequest) as e:
        embeddings.prepare_inputs(artifacts, ["ok", "x" * TEN_MB], 512)
    assert "'input[1]' is at least" in e.value.message and e.value.param == "input"


def test_byte_fallback_bpe_needs_its_byte_tokens():
    vocab = {"▁": 0, "▁hello": 1, "<unk>": 2}
    without = Tokenizer(models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    assert bytes_per_token_ceiling(without) is None  # unknown characters fuse into one <unk>
    with_bytes = {**vocab, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    tokenizer = Tokenizer(models.BPE(with_bytes, [], unk_token="<unk>", byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    assert bytes_per_token_ceiling(tokenizer) == len("▁hello".encode())
    text = "héllo wörld " * 500
    assert len(tokenizer.encode(text).ids) >= fewest_tokens(text, bytes_per_token_ceiling(tokenizer))


@pytest.fixture(scope="module")
def minilm():
    from services.models.minilm import build_embedding_model, default_embedding_model_dir

    return load_artifacts(str(build_embedding_model(default_embedding_model_dir())))


def test_wordpiece_splits_at_spaces_and_its_chunked_count_is_exact(minilm):
    assert minilm.space_split_kind == "BertPreTokenizer"
    text = ("Crème brûlée, naïve café! ΣΊΣΥΦΟΣ 中文字 [MASK] a\u0301b\u200bc \t\n" * 400)
    exact = len(minilm.tokenizer.encode(text, add_special_tokens=False).ids)
    assert length_floor.tokens_up_to(minilm.tokenizer, text, 10**9, chunk_chars=97) == exact
    assert exact + 10 >= length_floor.tokens_up_to(minilm.tokenizer, text, 100, chunk_chars=97) > 100


def test_pipelines_that_join_across_spaces_are_not_split(demo_model_dir):
    assert length_floor.space_split_kind(_byte_level()) is None  # byte-level BPE keeps the space in a token
    tokenizer = _byte_level(pre_tokenizer=pre_tokenizers.WhitespaceSplit())
    tokenizer.add_tokens(["New York"])
    assert length_floor.space_split_kind(tokenizer) is None  # an added token spans a space


@pytest.mark.parametrize("text", ["The quick brown fox. " * (TEN_MB // 21), "." * TEN_MB])
def test_a_10_mb_embeddings_input_is_refused_in_moments(minilm, text):
    started = time.perf_counter()
    with pytest.raises(InvalidRequest) as e:
        embeddings.prepare_inputs(minilm, ["ok", text], 256)
    assert "'input[1]' is at least" in e.value.message and e.value.param == "input"
    assert time.perf_counter() - started < 3.0  # encoding it all took 16.7 s


def test_a_long_embeddings_input_that_fits_is_kept(minilm):
    word = "a" * 200_000  # one over-long word: [CLS] [UNK] [SEP]
    assert embeddings.prepare_inputs(minilm, [word], 256) == [[101, 100, 102]]


@hypothesis.settings(max_examples=300, deadline=None, suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(text=st.text(alphabet=st.one_of(st.sampled_from(" \t\n.,!"),
                                                 st.characters(exclude_categories=("Cs",))), max_size=400),
                  chunk=st.integers(1, 40))
def test_the_chunked_count_of_any_text_is_exact(minilm, text, chunk):
    exact = len(minilm.tokenizer.encode(text, add_special_tokens=False).ids)
    assert length_floor.tokens_up_to(minilm.tokenizer, text, 10**9, chunk_chars=chunk) == exact
