"""A model directory's tokenizer, loaded once per process however many stages need it.

The preprocessor encodes, the postprocessor decodes and the mocker decodes prompts with the same
Rust ``tokenizers.Tokenizer``; in the all-in-one shape they share a process, and a 150k-token vocabulary
takes close to a second and tens of MiB to load. Nothing mutates a loaded tokenizer (no truncation or
padding settings), so one object serves every stage and thread.

Which file is the tokenizer, first match (as Dynamo and vLLM choose):

1. ``tokenizer.json``;
2. a tiktoken ranks file, ``tiktoken.model`` or ``*.tiktoken`` (Kimi K2), with the split pattern its
   tokenization module assigns (read as text), or with ``--trust-remote-code`` the module's own class;
3. a SentencePiece ``tokenizer.model``;
4. a tokenizer class in the directory (``tokenizer_config.json`` ``auto_map``), run only with
   ``--trust-remote-code``.

Each becomes one ``tokenizers.Tokenizer`` (services/common/tokenizer_kinds). A directory with none of them,
or whose only tokenizer is code the flag does not allow, raises ``TokenizerUnavailable`` with one line
that says what is missing.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer

from services.common.flags import Flags
from services.common.tokenizer_kinds import fast_encoder, remote_code, sentencepiece_model, tiktoken_bpe

log = logging.getLogger(__name__)

TOKENIZER_FILE = "tokenizer.json"
TIKTOKEN_FILE = "tiktoken.model"
SENTENCEPIECE_FILE = "tokenizer.model"
TOKENIZER_CONFIG = "tokenizer_config.json"
TRUST_FLAG = "--trust-remote-code (DYN_TRUST_REMOTE_CODE)"
TOKENIZER_BACKENDS = ("default", "fastokens")  # --tokenizer: what encodes prompts

_loaded: dict[tuple[Path, bool], Tokenizer] = {}
_lock = threading.Lock()


class TokenizerUnavailable(ValueError):
    """The directory has no tokenizer this process may load; the message is one line saying why."""


@dataclasses.dataclass(frozen=True)
class TokenizerOptions:
    """Dynamo's tokenizer flags, as the stages that load tokenizers hold them."""

    backend: str = "default"  # --tokenizer: default (tokenizers) | fastokens, for encoding
    fallback: bool = True  # --tokenizer-fallback: tokenizers when fastokens cannot load a model
    trust_remote_code: bool = False  # --trust-remote-code: run an auto_map tokenizer class


DEFAULT_TOKENIZER_OPTIONS = TokenizerOptions()


@dataclasses.dataclass(frozen=True)
class TokenizerSource:
    kind: str  # "tokenizer.json" | "tiktoken" | "sentencepiece" | "remote-code"
    path: Path  # the file (the tokenizer_config.json for remote code)
    classes: tuple[str, ...]  # auto_map's AutoTokenizer classes (module.Class), if any


def add_trust_remote_code_flag(p: Flags) -> None:
    """Dynamo's --trust-remote-code, for each stage that loads tokenizers (the preprocessor owns it)."""
    p.add("--trust-remote-code", default=False, type=bool, dynamo_env="DYN_TRUST_REMOTE_CODE",
          help="run a tokenizer class the model directory ships (tokenizer_config.json auto_map) with "
               "transformers; off, such a model is refused (one line naming this flag)")


def tokenizer_config(model_dir: str | Path) -> dict[str, Any]:
    path = Path(model_dir) / TOKENIZER_CONFIG
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else {}


def _tiktoken_file(root: Path) -> Path | None:
    if (root / TIKTOKEN_FILE).is_file():
        return root / TIKTOKEN_FILE
    found = sorted(root.glob("*.tiktoken"))
    return found[0] if found else None


def find_source(model_dir: str | Path) -> TokenizerSource:
    """Which file is the directory's tokenizer (the module docstring's order).

    Raises:
        TokenizerUnavailable: none of them is there."""
    root = Path(model_dir)
    classes = remote_code.auto_tokenizer_classes(tokenizer_config(root))
    tiktoken_file = _tiktoken_file(root)
    if (root / TOKENIZER_FILE).is_file():
        return TokenizerSource("tokenizer.json", root / TOKENIZER_FILE, classes)
    if tiktoken_file is not None:
        return TokenizerSource("tiktoken", tiktoken_file, classes)
    if (root / SENTENCEPIECE_FILE).is_file():
        return TokenizerSource("sentencepiece", root / SENTENCEPIECE_FILE, classes)
    if classes:
        return TokenizerSource("remote-code", root / TOKENIZER_CONFIG, classes)
    raise TokenizerUnavailable(f"no tokenizer in {model_dir}: none of {TOKENIZER_FILE}, {TIKTOKEN_FILE} or "
                               f"*.tiktoken, {SENTENCEPIECE_FILE} (SentencePiece), nor a tokenizer class in "
                               f"{TOKENIZER_CONFIG}'s auto_map")


def has_tokenizer(model_dir: str | Path) -> bool:
    try:
        find_source(model_dir)
    except TokenizerUnavailable:
        return False
    return True


def tokenizer_files(model_dir: str | Path) -> tuple[str, ...]:
    """The names of the files besides the fixed ones (model_files.STAGE_FILES) that a stage needs to load the
    directory's tokenizer: a ``*.tiktoken`` file and the auto_map classes' modules."""
    root = Path(model_dir)
    found = [p.name for p in sorted(root.glob("*.tiktoken"))]
    found += [m for m in remote_code.module_files(tokenizer_config(root)) if (root / m).is_file()]
    return tuple(found)


def _added_tokens(config: dict[str, Any]) -> dict[int, AddedToken]:
    """``tokenizer_config.json``'s ``added_tokens_decoder``: id -> token, with its flags."""
    table = config.get("added_tokens_decoder")
    out: dict[int, AddedToken] = {}
    for key, entry in (table.items() if isinstance(table, dict) else ()):
        if isinstance(entry, dict) and isinstance(entry.get("content"), str) and str(key).isdigit():
            out[int(key)] = AddedToken(entry["content"], special=bool(entry.get("special", True)),
                                       single_word=bool(entry.get("single_word", False)),
                                       lstrip=bool(entry.get("lstrip", False)),
                                       rstrip=bool(entry.get("rstrip", False)), normalized=False)
    return out


def _tiktoken(root: Path, source: TokenizerSource) -> Tokenizer:
    modules = [root / m for m in remote_code.module_files(tokenizer_config(root))]
    errors = []
    for module in modules:
        if not module.is_file():
            errors.append(f"{module.name} is missing")
            continue
        try:
            pattern = tiktoken_bpe.pattern_from_code(module.read_text())
        except (tiktoken_bpe.PatternNotFound, SyntaxError) as e:
            errors.append(f"{module.name}: {e}")
            continue
        return tiktoken_bpe.to_tokenizer(tiktoken_bpe.read_ranks(source.path), pattern,
                                         _added_tokens(tokenizer_config(root)))
    why = "; ".join(errors) or f"{TOKENIZER_CONFIG} names no tokenization module (auto_map)"
    raise TokenizerUnavailable(f"{source.path} has no split pattern that can be read without running code ({why}); "
                               f"{TRUST_FLAG} runs the model's tokenizer class instead")


def _convert(root: Path, source: TokenizerSource, trust_remote_code: bool) -> Tokenizer:
    if source.kind == "tokenizer.json":
        return Tokenizer.from_file(str(source.path))
    if source.classes and trust_remote_code and source.kind in ("tiktoken", "remote-code"):
        try:
            return remote_code.load(root)  # the class itself: its pattern and tables, exactly
        except remote_code.RemoteTokenizerError as e:
            raise TokenizerUnavailable(str(e)) from e
    if source.kind == "tiktoken":
        return _tiktoken(root, source)
    if source.kind == "sentencepiece":
        try:
            return sentencepiece_model.to_tokenizer(source.path)
        except sentencepiece_model.UnsupportedModel as e:
            raise TokenizerUnavailable(str(e)) from e
    raise TokenizerUnavailable(f"the tokenizer of {root} is the class {source.classes[0]} in the model directory, "
                               f"which runs only with {TRUST_FLAG}")


def load_tokenizer(model_dir: str | Path, *, trust_remote_code: bool = False) -> Tokenizer:
    """The directory's tokenizer, loaded on first use (blocking).

    Raises:
        TokenizerUnavailable: no tokenizer this process may load (one line).
        Exception: what ``tokenizers`` raises for a malformed file.
    """
    root = Path(model_dir).resolve()
    key = (root, trust_remote_code)
    found = _loaded.get(key)
    if found is not None:
        return found
    with _lock:
        found = _loaded.get(key)
        if found is None:
            found = _loaded[key] = _convert(root, find_source(root), trust_remote_code)
        return found


_encoders: dict[tuple[Path, bool, str], fast_encoder.Encoder] = {}


def load_encoder(model_dir: str | Path, options: TokenizerOptions) -> fast_encoder.Encoder:
    """What prompts are encoded with under ``--tokenizer``: the tokenizer itself (``default``), or fastokens
    over it, falling back to the tokenizer (logged) when fastokens cannot load it, unless
    ``--no-tokenizer-fallback``.

    Raises:
        TokenizerUnavailable: as ``load_tokenizer``; or fastokens failed with fallback off."""
    tokenizer = load_tokenizer(model_dir, trust_remote_code=options.trust_remote_code)
    if options.backend == "default":
        return tokenizer
    fallback = options.fallback
    key = (Path(model_dir).resolve(), options.trust_remote_code, options.backend)
    with _lock:
        found = _encoders.get(key)
        if found is None:
            try:
                found = fast_encoder.fastokens_encoder(tokenizer)
            except fast_encoder.FastEncoderError as e:
                if not fallback:
                    raise TokenizerUnavailable(f"--tokenizer fastokens: {model_dir}: {e} (and "
                                               "--no-tokenizer-fallback)") from e
                log.warning("--tokenizer fastokens: %s: %s; encoding with tokenizers instead", model_dir, e)
                found = tokenizer
            _encoders[key] = found
        return found
