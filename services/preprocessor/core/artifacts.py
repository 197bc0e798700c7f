"""What the preprocessor reads from a model directory, loaded once per directory.

Mirrors Dynamo's model-card resolution (dynamo-frontend.md §3.1-3.2):
- tokenizer: ``tokenizer.json``, a tiktoken ranks file, a SentencePiece ``tokenizer.model`` or (with
  ``--trust-remote-code``) the directory's own tokenizer class, each as a Rust ``tokenizers.Tokenizer``
  (services/common/tokenizer_files.py); prompts are encoded by ``encoder``, the same tokenizer or fastokens
  over it (``--tokenizer fastokens``);
- chat template: ``chat_template.jinja``, else ``chat_template.json`` (its ``chat_template`` key),
  else ``tokenizer_config.json``'s ``chat_template``; each may be a string or a list of
  ``{name, template}`` entries;
- special tokens (bos/eos/unk/pad) from ``tokenizer_config.json`` (string or AddedToken dict);
- EOS ids from ``config.json`` then ``generation_config.json`` (int or list), else the eos token;
- context length from ``config.json`` ``max_position_embeddings``, else ``model_max_length``
  (the registration's value, when set, wins; see ``effective_context_length``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import threading
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from services.common.tokenizer_files import (
    DEFAULT_TOKENIZER_OPTIONS,
    TokenizerOptions,
    TokenizerUnavailable,
    load_encoder,
    load_tokenizer,
)
from services.common.tokenizer_kinds.fast_encoder import Encoder
from services.preprocessor.core import length_floor
from services.preprocessor.core.byte_bound import bytes_per_token_ceiling
from services.preprocessor.core.length_floor import space_split_kind
from services.preprocessor.core.prefix_cache import Cuts

# transformers writes int(1e30) as model_max_length when a tokenizer has no limit.
_UNLIMITED = 10**18
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")


class ArtifactError(Exception):
    """The model directory is missing something the preprocessor needs."""


@dataclasses.dataclass(frozen=True)
class ModelArtifacts:
    model_dir: str
    tokenizer: Tokenizer
    # Template name -> source; a single-string template is registered as "default".
    templates: dict[str, str]
    # bos/eos/unk/pad token strings exposed to the template, as transformers does.
    special_tokens: dict[str, str]
    eos_token_ids: tuple[int, ...]
    context_length: int
    # Largest valid id + 1: the tokenizer's vocabulary or the model's (padded) one, whichever is larger.
    vocab_size: int
    # What encodes prompts (--tokenizer): ``tokenizer`` itself, or fastokens over it.
    encoder: Encoder

    def template_for(self, has_tools: bool) -> str | None:
        """``tool_use`` when tools are offered and the model has one, else ``default``."""
        if has_tools and "tool_use" in self.templates:
            return self.templates["tool_use"]
        return self.templates.get("default")

    def effective_context_length(self, registered: int) -> int:
        return registered if registered > 0 else self.context_length

    @functools.cached_property
    def bytes_per_token_ceiling(self) -> float | None:
        """Most bytes of text one token stands for (byte_bound.py); None: the tokenizer admits no such bound.

        Read from the vocabulary, a few tenths of a second for 150k tokens (``read_length_floor``)."""
        return bytes_per_token_ceiling(self.tokenizer)

    @functools.cached_property
    def prefix_cuts(self) -> Cuts | None:
        """Where a prompt may be cut for the prefix cache (prefix_cache.py); None: nowhere safe, or not worth it.

        Not worth it over fastokens (``--tokenizer fastokens``): it encodes a 2,250-token prompt in about 0.13 ms
        of CPU, and reusing an earlier turn's ids costs about as much again (``python -m bench multiturn``)."""
        if not isinstance(self.encoder, Tokenizer):
            return None
        return Cuts.of(self.tokenizer.get_added_tokens_decoder())

    @functools.cached_property
    def space_split_kind(self) -> str | None:
        """The pre-tokenizer's type when no token crosses a space (length_floor.py); None otherwise."""
        return space_split_kind(self.tokenizer)

    def read_length_floor(self) -> None:
        """Reads what ``fewest_tokens`` needs from the tokenizer now, as the model loads (on a thread). Read at
        the first large prompt instead, the vocabulary's copy into Python held the GIL for ~200 ms, and every
        stream the process carried stalled for as long."""
        _ = self.bytes_per_token_ceiling, self.space_split_kind, self.prefix_cuts

    def fewest_tokens(self, text: str, limit: int) -> int:
        """A floor on the tokens ``text`` encodes to (no special tokens), found without encoding all of it;
        past ``limit`` it stops counting. 0 when the tokenizer admits no floor."""
        return length_floor.fewest_tokens(text, limit, ceiling=self.bytes_per_token_ceiling,
                                          split_kind=self.space_split_kind, tokenizer=self.tokenizer)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ArtifactError(f"{path} is not valid JSON: {e}") from e
    return data if isinstance(data, dict) else {}


def _templates_from(value: Any) -> dict[str, str]:
    if isinstance(value, str):
        return {"default": value}
    if isinstance(value, list):
        named = {t["name"]: t["template"] for t in value
                 if isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str)}
        return named
    return {}


def _load_templates(root: Path, tokenizer_config: dict[str, Any]) -> dict[str, str]:
    jinja_file = root / "chat_template.jinja"
    if jinja_file.is_file():
        return {"default": jinja_file.read_text(encoding="utf-8")}
    from_json = _templates_from(_read_json(root / "chat_template.json").get("chat_template"))
    if from_json:
        return from_json
    return _templates_from(tokenizer_config.get("chat_template"))


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _ids(value: Any) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _eos_ids(config: dict, generation_config: dict, tokenizer: Tokenizer, eos_token: str | None) -> tuple[int, ...]:
    ids: list[int] = []
    for value in (config.get("eos_token_id"), generation_config.get("eos_token_id")):
        ids.extend(i for i in _ids(value) if i not in ids)
    if not ids and eos_token is not None:
        eos_id = tokenizer.token_to_id(eos_token)
        if eos_id is not None:
            ids.append(eos_id)
    return tuple(ids)


def _context_length(config: dict, tokenizer_config: dict) -> int:
    for value in (config.get("max_position_embeddings"), tokenizer_config.get("model_max_length")):
        if isinstance(value, int) and 0 < value < _UNLIMITED:
            return value
    return 0


def load_artifacts(model_dir: str, options: TokenizerOptions = DEFAULT_TOKENIZER_OPTIONS) -> ModelArtifacts:
    """Reads one model directory (about 0.5 s for a 150k-token vocabulary).

    Raises:
        ArtifactError: no tokenizer this preprocessor may load (one line: what is missing, or the flag)."""
    root = Path(model_dir)
    try:
        tokenizer = load_tokenizer(root, trust_remote_code=options.trust_remote_code)
        encoder = load_encoder(root, options)
    except TokenizerUnavailable as e:
        raise ArtifactError(str(e)) from None
    tokenizer_config = _read_json(root / "tokenizer_config.json")
    config = _read_json(root / "config.json")
    special = {k: t for k in SPECIAL_TOKEN_KEYS if (t := _token_text(tokenizer_config.get(k))) is not None}
    vocab = config.get("vocab_size")
    model_vocab = vocab if isinstance(vocab, int) else 0
    return ModelArtifacts(
        model_dir=str(model_dir),
        tokenizer=tokenizer,
        templates=_load_templates(root, tokenizer_config),
        special_tokens=special,
        eos_token_ids=_eos_ids(config, _read_json(root / "generation_config.json"), tokenizer,
                               special.get("eos_token")),
        context_length=_context_length(config, tokenizer_config),
        vocab_size=max(tokenizer.get_vocab_size(with_added_tokens=True), model_vocab),
        encoder=encoder,
    )


class ArtifactCache:
    """Loaded artifacts by directory. A directory is read once even when requests race for it."""

    def __init__(self, options: TokenizerOptions = DEFAULT_TOKENIZER_OPTIONS) -> None:
        self._loaded: dict[str, ModelArtifacts] = {}
        self._lock = threading.Lock()
        self.options = options  # --tokenizer, --tokenizer-fallback, --trust-remote-code

    def peek(self, model_dir: str) -> ModelArtifacts | None:
        return self._loaded.get(model_dir)

    def get(self, model_dir: str) -> ModelArtifacts:
        """Returns the cached artifacts, loading them (blocking) on first use."""
        found = self._loaded.get(model_dir)
        if found is not None:
            return found
        with self._lock:
            found = self._loaded.get(model_dir)
            if found is None:
                found = load_artifacts(model_dir, self.options)
                self._loaded[model_dir] = found
            return found
