"""A model directory's ``tokenizer.json``, loaded once per process however many stages need it.

The preprocessor encodes, the postprocessor decodes and the mocker decodes prompts with the same
Rust ``tokenizers.Tokenizer``; in the all-in-one shape they share a process, and a 150k-token vocabulary
takes close to a second and tens of MiB to load. Nothing mutates a loaded tokenizer (no truncation or
padding settings), so one object serves every stage and thread.
"""

from __future__ import annotations

import threading
from pathlib import Path

from tokenizers import Tokenizer

TOKENIZER_FILE = "tokenizer.json"

_loaded: dict[Path, Tokenizer] = {}
_lock = threading.Lock()


def load_tokenizer(model_dir: str | Path) -> Tokenizer:
    """The directory's tokenizer, loaded on first use (blocking).

    Raises:
        FileNotFoundError: the directory has no tokenizer.json.
        Exception: what ``tokenizers`` raises for a malformed file.
    """
    path = (Path(model_dir) / TOKENIZER_FILE).resolve()
    found = _loaded.get(path)
    if found is not None:
        return found
    with _lock:
        found = _loaded.get(path)
        if found is None:
            if not path.is_file():
                raise FileNotFoundError(f"no {TOKENIZER_FILE} in {model_dir}")
            found = _loaded[path] = Tokenizer.from_file(str(path))
        return found
