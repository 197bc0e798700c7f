"""Images for SGLang: what the preprocessor sent (services/workers/engine.py MediaInput) as SGLang's request.

The same contract as vLLM's (services/workers/vllm/media.py): the preprocessor has fetched each image
once, placed its (already expanded) placeholder tokens in the token ids and hashed its bytes.
SGLang's ``GenerateReqInput`` takes the bytes as they are in ``image_data`` (its tokenizer manager
decodes them), and the content hash in ``mm_hashes``, the field SGLang keeps for external KV routers:
SGLang then derives the image's pad value, and so its prefix-cache key, from our hash instead of
hashing the processed pixels, so the same image reuses the same cache on both sides of the mesh.

Modalities come from SGLang's model config (``input_modalities``), never a flag: ``image`` for a model
whose config has a vision tower and that SGLang serves as multimodal; video and audio are not mapped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from services.workers.engine import MediaInput


def input_modalities(model_config: Any) -> tuple[str, ...]:
    """The modalities the worker's card declares, from SGLang's ``ModelConfig``."""
    return ("image",) if model_config.is_image_understandable_model else ()


def media_kwargs(media: Sequence[MediaInput]) -> dict[str, Any]:
    """``image_data`` and ``mm_hashes`` for ``Engine.async_generate`` (empty without media).

    Only images reach here: the card declares nothing else and the worker service refuses what the card
    does not declare.
    """
    if not media:
        return {}
    return {"image_data": [item.content for item in media],
            "mm_hashes": [f"{item.content_hash:016x}" for item in media]}
