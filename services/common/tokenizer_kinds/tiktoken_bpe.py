"""A tiktoken ranks file (``tiktoken.model``, ``*.tiktoken``) as a ``tokenizers.Tokenizer``.

tiktoken splits text with a regex (the *pattern*, which the ranks file does not hold: Kimi's lives in its
``tokenization_kimi.py``), then byte-pair merges each piece: while two adjacent parts concatenate to a ranked
token, merge the pair whose concatenation has the lowest rank (leftmost on ties). A whole piece that is a
token is that token at once.

The same algorithm in ``tokenizers``' BPE: the vocabulary is the ranks (each byte string written in the
byte-level alphabet), ``ignore_merges`` takes a whole piece that is a token, and the merges list *every*
split of each token into two ranked halves, ordered by the rank of the token they make. tiktoken merges a
pair whenever the concatenation is ranked, whichever merges made its halves, so every split must be listed
(only the best split of each token, as a trained merges file has, would miss pairs tiktoken merges). The
ids equal tiktoken's; tests/unit/common/test_tokenizer_kinds.py holds them to tiktoken itself.

The pattern comes from the model's own code read as text (``pattern_from_code``: an assignment to
``pat_str`` made of string literals, ``"|".join([...])`` and ``+``), so nothing from the model directory
runs unless ``--trust-remote-code`` loads the class itself (remote_code.py).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Mapping
from pathlib import Path

from tiktoken.load import load_tiktoken_bpe
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

PATTERN_NAMES = ("pat_str", "PAT_STR")


class PatternNotFound(ValueError):
    """The tokenization code names no pattern that can be read without running it."""


@functools.cache
def _byte_chars() -> tuple[str, ...]:
    """GPT-2's byte-level alphabet: byte b -> one printable character (what ``pre_tokenizers.ByteLevel``
    writes), so a byte string becomes a vocabulary key."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return tuple(chars[b] for b in range(256))


def _text(token: bytes) -> str:
    table = _byte_chars()
    return "".join(table[b] for b in token)


def read_ranks(path: str | Path) -> dict[bytes, int]:
    """The ranks file: one ``base64(token) rank`` line per token."""
    return load_tiktoken_bpe(str(path))


def _merges(ranks: Mapping[bytes, int]) -> list[tuple[str, str]]:
    """Every (left, right) whose concatenation is ranked, both halves ranked, by the concatenation's rank."""
    found: list[tuple[int, int, int, bytes, bytes]] = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            lr, rr = ranks.get(left), ranks.get(right)
            if lr is not None and rr is not None:
                found.append((rank, lr, rr, left, right))
    found.sort()
    return [(_text(left), _text(right)) for _, _, _, left, right in found]


def to_tokenizer(ranks: Mapping[bytes, int], pattern: str,
                 added: Mapping[int, AddedToken] | None = None) -> Tokenizer:
    """The tokenizer tiktoken's ``Encoding(pat_str=pattern, mergeable_ranks=ranks)`` encodes as, with
    ``added`` (id -> token, from ``tokenizer_config.json``'s ``added_tokens_decoder``) at their ids.

    Raises:
        ValueError: a byte is not ranked (tiktoken requires all 256), or an added token's id is taken."""
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise ValueError(f"the ranks file lacks {len(missing)} single bytes (e.g. {missing[0]:#04x}); tiktoken "
                         "needs every byte ranked")
    vocab = {_text(token): rank for token, rank in ranks.items()}
    bpe = models.BPE(vocab=vocab, merges=_merges(ranks), ignore_merges=True)
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    _add_at_ids(tokenizer, added or {}, len(ranks))
    return tokenizer


def _add_at_ids(tokenizer: Tokenizer, added: Mapping[int, AddedToken], base: int) -> None:
    """``tokenizers`` gives an added token the next free id, so ids past the ranks that no token claims are
    filled with reserved placeholders (as Kimi's class fills its 256 reserved ids) to keep every id."""
    taken = set(range(base))
    for token_id in sorted(added):
        if token_id in taken:
            raise ValueError(f"added token {added[token_id].content!r} has id {token_id}, which a ranked token has")
    next_id = base
    for token_id in sorted(added):
        while next_id < token_id:
            tokenizer.add_special_tokens([AddedToken(f"<|reserved_token_{next_id}|>", special=True,
                                                     normalized=False)])
            next_id += 1
        token = added[token_id]
        if token.special:
            tokenizer.add_special_tokens([token])
        else:
            tokenizer.add_tokens([token])
        next_id += 1
        if tokenizer.token_to_id(token.content) != token_id:
            raise ValueError(f"added token {token.content!r} does not land on its id {token_id}")


class _Evaluator(ast.NodeVisitor):
    """Evaluates string expressions without running anything: literals, ``+``, ``"sep".join([...])`` and
    names bound earlier in the module to such expressions."""

    def __init__(self, names: Mapping[str, str]):
        self.names = names

    def value(self, node: ast.AST) -> str:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name) and node.id in self.names:
            return self.names[node.id]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self.value(node.left) + self.value(node.right)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join"
                and len(node.args) == 1 and not node.keywords and isinstance(node.args[0], (ast.List, ast.Tuple))):
            return self.value(node.func.value).join(self.value(e) for e in node.args[0].elts)
        raise PatternNotFound(f"line {getattr(node, 'lineno', '?')}: not a string made of literals")


def _targets(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AnnAssign) and node.value is not None:
        targets = [node.target]
    else:
        return []
    names = []
    for t in targets:
        if isinstance(t, ast.Name):
            names.append(t.id)
        elif isinstance(t, ast.Attribute):  # self.pat_str = ...
            names.append(t.attr)
    return names


def pattern_from_code(source: str) -> str:
    """The split pattern a tokenization module assigns to ``pat_str`` (module, class or ``self.`` level).

    Raises:
        PatternNotFound: no such assignment, or one that is not made of string literals."""
    tree = ast.parse(source)
    names: dict[str, str] = {}
    for node in tree.body:  # module-level string constants a pattern may be built from
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        for name in _targets(node):
            try:
                names[name] = _Evaluator(names).value(node.value)
            except PatternNotFound:
                continue
    for found in ast.walk(tree):
        if isinstance(found, (ast.Assign, ast.AnnAssign)) and found.value is not None \
                and any(name in PATTERN_NAMES for name in _targets(found)):
            return _Evaluator(names).value(found.value)
    raise PatternNotFound(f"no assignment to {' or '.join(PATTERN_NAMES)}")
