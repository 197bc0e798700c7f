"""Tokenizers loaded once per model directory and shared by every request of that model.

Loading ``tokenizer.json`` takes close to a second for a 150k vocabulary, so it happens once per
``model_dir`` (the service does the first load off the event loop). The cache is keyed by the
directory string the preprocessor sends, which is the worker card's ``model_dir``. Every format the
preprocessor reads loads here too (services/common/tokenizer_files.py); a tokenizer class in the model
directory only with ``--trust-remote-code``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from tokenizers import Tokenizer

from services.common.tokenizer_files import TokenizerUnavailable, load_tokenizer
from services.postprocessor.core.logprobs import TokenTexts


class TokenizerLoadError(Exception):
    """The model directory has no tokenizer this postprocessor may load."""


@dataclass(frozen=True)
class ModelTokenizer:
    """A model's tokenizer and its memoised token texts (for logprobs)."""

    tokenizer: Tokenizer
    texts: TokenTexts


class TokenizerCache:
    """Thread-safe map from model directory to its tokenizer."""

    def __init__(self, *, trust_remote_code: bool = False) -> None:
        self._tokenizers: dict[str, ModelTokenizer] = {}
        self._lock = threading.Lock()
        self._trust_remote_code = trust_remote_code  # --trust-remote-code

    def get(self, model_dir: str) -> ModelTokenizer | None:
        """The cached tokenizer, or None if ``load`` has not run for this directory yet."""
        return self._tokenizers.get(model_dir)

    def load(self, model_dir: str) -> ModelTokenizer:
        """Loads (blocking) and caches the tokenizer of ``model_dir``.

        Raises:
            TokenizerLoadError: the file is missing or not a valid tokenizer.
        """
        with self._lock:
            cached = self._tokenizers.get(model_dir)
            if cached is not None:
                return cached
            try:
                tokenizer = load_tokenizer(model_dir, trust_remote_code=self._trust_remote_code)
            except TokenizerUnavailable as e:
                raise TokenizerLoadError(str(e)) from e
            except Exception as e:  # tokenizers raises plain Exception for malformed files
                raise TokenizerLoadError(f"cannot load the tokenizer of {model_dir}: {e}") from e
            loaded = ModelTokenizer(tokenizer, TokenTexts(tokenizer))
            self._tokenizers[model_dir] = loaded
            return loaded
