"""Images for vLLM: what the preprocessor sent (services/workers/engine.py MediaInput) as vLLM's prompt.

The preprocessor has fetched each image once, checked it, placed its placeholder tokens (already
expanded to the count Qwen2-VL's processor gives, so vLLM finds them applied and keeps them) and
hashed its bytes. Here each one becomes a decoded PIL image in ``multi_modal_data`` and gets a
``multi_modal_uuids`` entry naming that content hash:

- vLLM keys its processor and encoder caches on the uuid instead of hashing the pixels again; and
- the uuid is what vLLM's KV events name a multimodal block by (``BlockStored.extra_keys``:
  ``(uuid, offset)`` pairs), so the worker reads the content hash back from them and salts its block
  hashes exactly as the preprocessor salted the prompt's (``extra_key_content_hashes``): the kv
  router predicts a hit for the same image and never for a different one.

The client's own uuid is not passed on: the preprocessor has already resolved it to bytes, and a name
a client chose must not select another client's image from vLLM's caches.

Which modalities a worker takes comes from the engine's model config (``input_modalities``), never a
flag: those the model's processor supports, that ``--limit-mm-per-prompt`` leaves above 0, and that
this adapter maps (images, for now).
"""

from __future__ import annotations

import importlib.util
import io
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from services.workers.engine import MediaInput, RequestRejected

MAPPED_MODALITIES = ("image",)
UUID_PREFIX = "xxh3:"  # then the content hash as 16 hex digits
WITHOUT_TORCHVISION = Path(__file__).parent / "without_torchvision"


def enable_pil_processors(environ: dict[str, str] | Any = os.environ) -> None:
    """Lets this process and every one it starts load Qwen2-VL's processor without torchvision.

    Call before importing vLLM. See without_torchvision/sitecustomize.py for why and how.
    """
    paths = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(WITHOUT_TORCHVISION) not in paths:
        environ["PYTHONPATH"] = os.pathsep.join([str(WITHOUT_TORCHVISION), *paths])
    spec = importlib.util.spec_from_file_location("meshfront_without_torchvision",
                                                  WITHOUT_TORCHVISION / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))  # installs the finder here too


def input_modalities(model_config: Any) -> tuple[str, ...]:
    """The modalities this worker's card declares, from vLLM's model config (see the module doc)."""
    if not model_config.is_multimodal_model or model_config.multimodal_config is None:
        return ()
    from vllm.multimodal import MULTIMODAL_REGISTRY

    limits = model_config.multimodal_config
    supported = MULTIMODAL_REGISTRY.get_processing_info(model_config).supported_mm_limits
    return tuple(m for m in MAPPED_MODALITIES if m in supported and limits.get_limit_per_prompt(m) > 0)


def mm_uuid(content_hash: int) -> str:
    return f"{UUID_PREFIX}{content_hash:016x}"


def content_hash_of(identifier: object) -> int | None:
    """The content hash a ``mm_uuid`` names; None for an identifier vLLM computed itself."""
    if isinstance(identifier, str) and identifier.startswith(UUID_PREFIX):
        try:
            return int(identifier[len(UUID_PREFIX):], 16)
        except ValueError:
            return None
    return None


def extra_key_content_hashes(extra_keys: Sequence[Iterable[Any] | None] | None, blocks: int
                             ) -> list[list[int] | None] | None:
    """Per block, the content hashes of the images vLLM says it holds (``BlockStored.extra_keys``).

    Each entry lists the block's ``(mm_identifier, offset)`` pairs, then bare LoRA names and cache
    salts. Returns None for a text-only event. Raises ValueError for a media identifier this worker did
    not give (vLLM hashed the item itself, e.g. with per-request processor kwargs): such a block's hash
    cannot be made to match the router's, and guessing would predict hits that are not there.
    """
    if not extra_keys:
        return None
    out: list[list[int] | None] = []
    for keys in list(extra_keys)[:blocks]:
        hashes: list[int] = []
        for key in keys or ():
            if isinstance(key, (tuple, list)) and len(key) == 2:  # (mm_identifier, offset); the rest are strings
                content_hash = content_hash_of(key[0])
                if content_hash is None:
                    raise ValueError(f"a multimodal block names an item the worker did not: {key[0]!r}")
                hashes.append(content_hash)
        out.append(hashes or None)
    return out if any(out) else None


def decode_image(item: MediaInput):
    """The image's bytes as a PIL image, fully decoded (the preprocessor has already proved they decode)."""
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(item.content))
        image.load()
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise RequestRejected(f"an image could not be decoded: {e}") from None
    return image


def multimodal_fields(media: Sequence[MediaInput]) -> dict[str, Any]:
    """``multi_modal_data`` and ``multi_modal_uuids`` for vLLM's prompt (empty without media).

    Decoding is CPU work: the engine calls this in a thread.
    """
    if not media:
        return {}
    data: dict[str, list[Any]] = {}
    uuids: dict[str, list[str]] = {}
    # Only images reach here: the card declares nothing else (input_modalities) and the worker service
    # refuses what the card does not declare.
    for item in media:
        data.setdefault(item.modality, []).append(decode_image(item))
        uuids.setdefault(item.modality, []).append(mm_uuid(item.content_hash))
    return {"multi_modal_data": data, "multi_modal_uuids": uuids}
