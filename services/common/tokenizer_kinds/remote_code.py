"""A tokenizer class that lives in the model directory, run by transformers (``--trust-remote-code`` only).

``tokenizer_config.json``'s ``auto_map`` names it (``{"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer",
null]}``: the slow class, then the fast one). Loading it runs that module, so the caller checks the flag
first (services/common/tokenizer_files.py). The loaded object becomes a ``tokenizers.Tokenizer`` like every
other format:

- a fast (``tokenizers``-backed) class: its backend tokenizer as it is;
- a class over a ``tiktoken.Encoding`` (Kimi's ``TikTokenTokenizer``): that encoding's ranks, pattern and
  special tokens, converted by tiktoken_bpe.py, so encoding is exactly the class's;
- any other slow class transformers knows how to convert (``convert_slow_tokenizer``).

A class that is none of these is refused with one line naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tiktoken
from tokenizers import AddedToken, Tokenizer

from services.common.tokenizer_kinds import tiktoken_bpe


class RemoteTokenizerError(ValueError):
    """The class could not be loaded, or turned into a ``tokenizers.Tokenizer``."""


def auto_tokenizer_classes(tokenizer_config: dict[str, Any]) -> tuple[str, ...]:
    """The ``module.Class`` references of ``auto_map``'s ``AutoTokenizer`` (slow first), if any."""
    auto_map = tokenizer_config.get("auto_map")
    entry = auto_map.get("AutoTokenizer") if isinstance(auto_map, dict) else None
    refs = entry if isinstance(entry, list) else [entry]
    return tuple(r for r in refs if isinstance(r, str) and r)


def module_files(tokenizer_config: dict[str, Any]) -> tuple[str, ...]:
    """The model directory's Python files those classes live in (``tokenization_kimi.py``); a reference to
    another repository (``org/repo--module.Class``) names none here."""
    out = []
    for ref in auto_tokenizer_classes(tokenizer_config):
        module = ref.rpartition(".")[0]
        if module and "--" not in module and module.isidentifier():
            out.append(f"{module}.py")
    return tuple(dict.fromkeys(out))


def _tiktoken_encoding(loaded: Any) -> tiktoken.Encoding | None:
    found = [v for v in vars(loaded).values() if isinstance(v, tiktoken.Encoding)]
    return found[0] if found else None


def _from_tiktoken(loaded: Any, encoding: tiktoken.Encoding) -> Tokenizer:
    # The Encoding's own tables: what the class encodes with. Its special tokens take their flags from the
    # class's added tokens (Kimi marks some, such as tool markers, non-special).
    flags = {i: t for i, t in loaded.added_tokens_decoder.items()}
    added = {}
    for content, token_id in encoding._special_tokens.items():
        known = flags.get(token_id)
        added[token_id] = AddedToken(content, special=True if known is None else bool(known.special),
                                     normalized=False)
    return tiktoken_bpe.to_tokenizer(encoding._mergeable_ranks, encoding._pat_str, added)


def load(model_dir: str | Path) -> Tokenizer:
    """Runs the directory's tokenizer class and returns it as a ``tokenizers.Tokenizer``.

    Raises:
        RemoteTokenizerError: the class fails to load, or is neither fast, tiktoken-backed nor convertible."""
    from transformers import AutoTokenizer
    from transformers.convert_slow_tokenizer import convert_slow_tokenizer
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    try:
        loaded = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=True, local_files_only=True)
    except Exception as e:  # whatever the model's own code raises
        raise RemoteTokenizerError(f"the tokenizer class in {model_dir} failed to load: "
                                   f"{type(e).__name__}: {e}") from e
    if isinstance(loaded, TokenizersBackend):
        return loaded.backend_tokenizer
    encoding = _tiktoken_encoding(loaded)
    if encoding is not None:
        return _from_tiktoken(loaded, encoding)
    try:
        return convert_slow_tokenizer(loaded)
    except (ValueError, KeyError, AttributeError) as e:
        raise RemoteTokenizerError(f"the tokenizer class {type(loaded).__name__} in {model_dir} is neither fast, "
                                   f"tiktoken-backed nor convertible by transformers ({e})") from e
