"""A sentence-transformers model directory run with transformers on the CPU: token ids in, vectors out.

What sentence-transformers would do for a Transformer -> Pooling -> (Normalize) pipeline, read from
the directory's own files, without depending on sentence-transformers:

- ``modules.json``: whether a ``Normalize`` module follows the pooling (unit-length vectors);
- ``1_Pooling/config.json`` (the Pooling module's path): mean over real tokens, or the CLS token;
- ``sentence_bert_config.json``: ``max_seq_length``, the longest input the model was trained for
  (256 for all-MiniLM-L6-v2; its position table holds 512, but quality past training length is not
  what a client asked for), else config.json's ``max_position_embeddings``.

A batch is padded to its longest input with the model's pad id; the attention mask keeps padding
out of both attention and pooling, so an input's vector does not depend on its batch-mates.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

POOLING_MODULE = "sentence_transformers.models.Pooling"
NORMALIZE_MODULE = "sentence_transformers.models.Normalize"


class ModelDirError(ValueError):
    """The directory is not a sentence-transformers model this worker can run."""


@dataclasses.dataclass(frozen=True)
class EmbeddingShape:
    """What the mesh needs to know about an embedding model, read without loading weights."""

    dimensions: int
    max_input_tokens: int
    vocab_size: int
    pad_token_id: int
    pooling: str  # "mean" | "cls"
    normalize: bool


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise ModelDirError(f"{path} is not valid JSON: {e}") from e


def read_shape(model_dir: str | Path) -> EmbeddingShape:
    root = Path(model_dir)
    config = _json(root / "config.json")
    if not isinstance(config, dict) or not isinstance(config.get("hidden_size"), int):
        raise ModelDirError(f"{root / 'config.json'} has no hidden_size: not a transformer model directory")
    modules = _json(root / "modules.json") or []
    types = {m.get("type"): m for m in modules if isinstance(m, dict)}
    pooling_dir = root / str(types.get(POOLING_MODULE, {}).get("path") or "1_Pooling")
    pooling_cfg = _json(pooling_dir / "config.json") or {"pooling_mode_mean_tokens": True}
    if pooling_cfg.get("pooling_mode_mean_tokens"):
        pooling = "mean"
    elif pooling_cfg.get("pooling_mode_cls_token"):
        pooling = "cls"
    else:
        raise ModelDirError(f"{pooling_dir / 'config.json'}: only mean or CLS pooling is supported")
    st_config = _json(root / "sentence_bert_config.json") or {}
    max_len = st_config.get("max_seq_length") or config.get("max_position_embeddings")
    if not isinstance(max_len, int) or max_len <= 0:
        raise ModelDirError(f"{root}: no max_seq_length or max_position_embeddings")
    dims = pooling_cfg.get("word_embedding_dimension") or config["hidden_size"]
    return EmbeddingShape(dimensions=int(dims), max_input_tokens=max_len, vocab_size=int(config.get("vocab_size", 0)),
                          pad_token_id=int(config.get("pad_token_id") or 0), pooling=pooling,
                          normalize=NORMALIZE_MODULE in types)


class SentenceEmbedder:
    """Loads the weights (transformers' AutoModel, local files only) and embeds batches of token ids."""

    def __init__(self, model_dir: str | Path, *, threads: int = 0):
        import torch
        from transformers import AutoModel
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # a progress bar per start is noise in the mesh's log

        self.shape = read_shape(model_dir)
        if threads:
            torch.set_num_threads(threads)
        self._torch = torch
        self._model = AutoModel.from_pretrained(str(model_dir), local_files_only=True, dtype=torch.float32)
        self._model.eval()

    def embed(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        """float32 ``[len(batch), dimensions]``; each input used exactly as given (special tokens included)."""
        torch = self._torch
        longest = max(len(ids) for ids in batch)
        input_ids = torch.full((len(batch), longest), self.shape.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(batch), longest), dtype=torch.long)
        for row, ids in enumerate(batch):
            input_ids[row, :len(ids)] = torch.tensor(list(ids), dtype=torch.long)
            mask[row, :len(ids)] = 1
        with torch.inference_mode():
            hidden = self._model(input_ids=input_ids, attention_mask=mask).last_hidden_state
            if self.shape.pooling == "cls":
                pooled = hidden[:, 0]
            else:
                weights = mask.unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
            if self.shape.normalize:
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return pooled[:, :self.shape.dimensions].contiguous().numpy().astype(np.float32, copy=False)
