"""Images, videos and audio for vLLM: what the preprocessor sent (services/workers/engine.py MediaInput) as
vLLM's prompt.

The preprocessor has fetched each item once, checked it, placed its placeholder tokens (expanded to
the count Qwen2-VL's processor gives, so the router's hashes and ``usage`` see the real prompt) and
hashed its bytes. vLLM 0.32 expands every placeholder token it finds, an already expanded run included
(it would turn N placeholders into 2N - 1), so ``engine_token_ids`` (services/workers/engine.py) gives it each
run collapsed back to the one placeholder the chat template wrote; vLLM expands it again to the same count
(tests/engine_env/vllm/test_vllm_video.py checks vLLM's prompt equals the mesh's, token for token).

Each image becomes a decoded PIL image in ``multi_modal_data`` and each video the
``(frames, height, width, 3)`` array of the frames services/common/video_frames.py samples (the rule the
preprocessor counted its tokens by; Qwen2-VL's video processor samples only when asked), and each audio clip
the ``(samples, 16000)`` pair services/common/audio_samples.py decodes (16 kHz mono float32, the samples the
preprocessor counted; at the model's rate, so vLLM resamples nothing). Each gets a
``multi_modal_uuids`` entry naming its content hash:

- vLLM keys its processor and encoder caches on the uuid instead of hashing the pixels again; and
- the uuid is what vLLM's KV events name a multimodal block by (``BlockStored.extra_keys``:
  ``(uuid, offset)`` pairs), so the worker reads the content hash back from them and salts its block
  hashes exactly as the preprocessor salted the prompt's (``extra_key_content_hashes``): the kv
  router predicts a hit for the same image and never for a different one.

The client's own uuid is not passed on: the preprocessor has already resolved it to bytes, and a name
a client chose must not select another client's image from vLLM's caches.

Which modalities a worker takes comes from the engine's model config (``input_modalities``), never a
flag: those the model's processor supports, that ``--limit-mm-per-prompt`` leaves above 0, and that
this adapter maps (images, videos and audio).
"""

from __future__ import annotations

import importlib.util
import io
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from services.common import audio_samples, video_frames
from services.workers.engine import MediaInput, RequestRejected

MAPPED_MODALITIES = ("image", "video", "audio")
# A sanity bound on one clip the worker decodes: the preprocessor bounds clips far tighter (--media-max-audio-s).
MAX_AUDIO_S = 3600.0
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


def decode_video(item: MediaInput):
    """The video's sampled frames (services/common/video_frames.py), as the preprocessor counted them."""
    import av

    try:
        return video_frames.decode_sampled(item.content)
    except (av.FFmpegError, ValueError, OSError) as e:
        raise RequestRejected(f"a video could not be decoded: {e}") from None


def decode_audio(item: MediaInput) -> tuple[Any, int]:
    """The clip as ``(samples, rate)``: the 16 kHz mono samples the preprocessor counted its tokens from."""
    try:
        samples = audio_samples.decode(item.content, item.format, audio_samples.SAMPLING_RATE, MAX_AUDIO_S)
    except audio_samples.AudioRefused as e:
        raise RequestRejected(f"an audio clip could not be decoded: {e}") from None
    return samples, audio_samples.SAMPLING_RATE


_DECODERS = {"image": decode_image, "video": decode_video, "audio": decode_audio}


def multimodal_fields(media: Sequence[MediaInput]) -> dict[str, Any]:
    """``multi_modal_data`` and ``multi_modal_uuids`` for vLLM's prompt (empty without media).

    A video is its sampled frames alone, with no metadata and no ``mm_processor_kwargs``: Qwen2-VL's video
    processor then takes every frame (it samples only when asked), and vLLM keys the item on its uuid
    (per-request processor kwargs would make vLLM hash the uuid with them, a name this worker did not give).

    Decoding is CPU work: the engine calls this in a thread.
    """
    if not media:
        return {}
    data: dict[str, list[Any]] = {}
    uuids: dict[str, list[str]] = {}
    # Only images, videos and audio reach here: the card declares nothing else (input_modalities) and the worker
    # service refuses what the card does not declare.
    for item in media:
        data.setdefault(item.modality, []).append(_DECODERS[item.modality](item))
        uuids.setdefault(item.modality, []).append(mm_uuid(item.content_hash))
    return {"multi_modal_data": data, "multi_modal_uuids": uuids}
