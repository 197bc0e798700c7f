"""What a worker reads from a model directory besides weights: context length, EOS ids, tokenizer."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from services.common.tokenizer_files import TokenizerUnavailable, has_tokenizer
from services.common.tokenizer_files import load_tokenizer as _load_shared

DEFAULT_CONTEXT_LENGTH = 4096


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    context_length: int
    # generation_config.json's eos ids (what generation stops on), else config.json's.
    eos_token_ids: tuple[int, ...]


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else {}


def _ids(value: Any) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,)
    if isinstance(value, list):
        return tuple(v for v in value if isinstance(v, int))
    return ()


def read_model_info(model_dir: str | Path) -> ModelInfo:
    """Reads config.json and generation_config.json; missing files give defaults."""
    root = Path(model_dir)
    config = _read_json(root / "config.json")
    generation = _read_json(root / "generation_config.json")
    context = config.get("max_position_embeddings") or config.get("max_seq_len") or DEFAULT_CONTEXT_LENGTH
    eos = _ids(generation.get("eos_token_id")) or _ids(config.get("eos_token_id"))
    return ModelInfo(context_length=int(context), eos_token_ids=eos)


def load_tokenizer(model_dir: str | Path) -> Any | None:
    """The directory's ``tokenizers.Tokenizer`` (Rust-backed; any format services/common/tokenizer_files.py
    reads), or None without one, or when its only tokenizer is a class in the directory: a worker has no
    --trust-remote-code, and such a model's mocker then runs without reading prompts."""
    if not has_tokenizer(model_dir):
        return None
    try:
        return _load_shared(model_dir)
    except TokenizerUnavailable:
        return None
