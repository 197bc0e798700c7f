"""Images, videos and audio for SGLang: what the preprocessor sent (services/workers/engine.py MediaInput) as
SGLang's request.

The same contract as vLLM's (services/workers/vllm/media.py): the preprocessor has fetched each item once,
placed its (already expanded) placeholder tokens in the token ids and hashed its bytes. What SGLang 0.5.23
does with that, read from its code and checked against it (tests/engine_env/sglang/test_sglang_mm_processor.py):

- **The prompt.** SGLang's Qwen-VL processor decodes ``input_ids`` to text and hands it to transformers'
  processor, which expands every ``<|image_pad|>`` it finds, one per image. An already expanded run runs
  its replacements out: transformers raises StopIteration inside SGLang's executor, which no future can
  carry, and the request never answers. So ``engine_token_ids`` (services/workers/engine.py) sends each placed
  run collapsed to the one placeholder the chat template wrote; SGLang expands it again to the same count
  (images: into the ids sent, verbatim, ``SGLANG_MM_AVOID_RETOKENIZE``; with a video: the processor's
  re-tokenisation of the decoded text), and its final ids equal the mesh's token for token, one ``mm_items``
  entry per item whose offsets are exactly the item's run.
- **Images** go as the bytes fetched, in ``image_data`` (SGLang's loader decodes them).
- **Videos** go as the ``(frames, height, width, 3)`` array of the frames services/common/video_frames.py
  samples, in ``video_data``: SGLang takes an array as the frames to use (``load_video``), skips its own
  sampling and resize (``preprocess_video`` only touches a file it decoded itself) and transformers'
  Qwen2-VL video processor samples none, so the grid is the one the preprocessor counted. Bytes would be
  sampled by SGLang's own rule (its decoder's fps, ``np.linspace``) within its own pixel bounds.
- **Audio** goes as the 16 kHz mono samples services/common/audio_samples.py decodes (what the preprocessor
  counted), wrapped losslessly as 32-bit float PCM in Matroska: SGLang takes audio only as a file or bytes,
  decodes a container it recognises (Matroska, MP4, ...) with PyAV at the model's 16 kHz, which passes these
  samples through unchanged, and sends anything else (WAV, MP3) to torchcodec or soundfile + torchaudio,
  whose resampling is not the preprocessor's.
- **Hashes.** Each item's content hash goes in ``mm_hashes``, the field SGLang keeps for external KV
  routers: SGLang derives the item's pad values, and so its prefix-cache key, from it instead of hashing
  the pixels (kv_media.py turns them back). SGLang pairs ``mm_hashes`` with its ``mm_items``, which its
  processor lists modality by modality (images, then videos; each in prompt order), not in prompt order;
  a list of the wrong length it ignores, so the hashes follow that order, one per item. SGLang splits a
  request's videos into items only frame group by frame group (``get_new_expanded_mm_items``: Qwen3-VL's
  layout), so two or more Qwen2-VL videos stay one item, over all their runs, unless every one is a single
  temporal patch: that item gets a hash of its own (``bundle_hash``), which the KV mapping never names, so
  the video blocks of such a request are left out of the router's index, not guessed (kv_media.py).

Modalities come from SGLang's model config (``input_modalities``), never a flag: ``image`` for a model
whose config has a vision tower and that SGLang serves as multimodal; ``video`` too for the model types whose
video path is checked here (Qwen2-VL: SGLang's ``QwenVLImageProcessor``, transformers' video processor,
the preprocessor's count); ``audio`` when SGLang's ``ModelConfig`` says the model understands audio and its
type is one checked here (Qwen2-Audio: SGLang's ``Qwen2AudioMultimodalProcessor``, the preprocessor's count).
No checked model takes audio beside images or videos, so where audio stands in SGLang's item order beside them
is not checked (``ITEM_ORDER`` puts it last).
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Sequence
from typing import Any

import numpy as np

from services.common import audio_samples, video_frames
from services.workers.engine import EngineRequest, MediaInput, RequestRejected, engine_token_ids

# SGLang's order of a request's mm_items (its processor output's keys: pixel_values, then pixel_values_videos).
ITEM_ORDER = ("image", "video", "audio")
# hf_config.model_type values whose video or audio mapping is checked against SGLang's processor (module doc).
VIDEO_MODEL_TYPES = ("qwen2_vl",)
AUDIO_MODEL_TYPES = ("qwen2_audio",)
# A sanity bound on one clip the worker decodes: the preprocessor bounds clips far tighter (--media-max-audio-s).
MAX_AUDIO_S = 3600.0
# The media the worker decodes before SGLang sees them (the rest go as the bytes fetched).
DECODED = ("video", "audio")


def input_modalities(model_config: Any) -> tuple[str, ...]:
    """The modalities the worker's card declares, from SGLang's ``ModelConfig``."""
    model_type = model_config.hf_config.model_type
    out: list[str] = []
    if model_config.is_image_understandable_model:
        out.append("image")
        if model_type in VIDEO_MODEL_TYPES:
            out.append("video")
    if model_config.is_audio_understandable_model and model_type in AUDIO_MODEL_TYPES:
        out.append("audio")
    return tuple(out)


def needs_decoding(media: Sequence[MediaInput]) -> bool:
    return any(item.modality in DECODED for item in media)


def decode(media: Sequence[MediaInput]) -> dict[str, list[Any]]:
    """Each video's sampled frames and each audio clip as SGLang takes it, per modality in prompt order
    (CPU work: the engine calls this in a thread). Refuses (400) what does not decode."""
    out: dict[str, list[Any]] = {m: [] for m in DECODED}
    for item in media:
        if item.modality == "video":
            out["video"].append(decode_video(item))
        elif item.modality == "audio":
            out["audio"].append(audio_container(decode_audio(item)))
    return out


def decode_video(item: MediaInput) -> np.ndarray:
    import av

    try:
        return video_frames.decode_sampled(item.content)
    except (av.FFmpegError, ValueError, OSError) as e:
        raise RequestRejected(f"a video could not be decoded: {e}") from None


def decode_audio(item: MediaInput) -> np.ndarray:
    """The clip's 16 kHz mono samples: the ones the preprocessor counted its tokens from."""
    try:
        return audio_samples.decode(item.content, item.format, audio_samples.SAMPLING_RATE, MAX_AUDIO_S)
    except audio_samples.AudioRefused as e:
        raise RequestRejected(f"an audio clip could not be decoded: {e}") from None


def audio_container(samples: np.ndarray) -> bytes:
    """``samples`` (16 kHz mono float32) as 32-bit float PCM in Matroska, which SGLang decodes back unchanged."""
    import av

    out = io.BytesIO()
    with av.open(out, mode="w", format="matroska") as container:
        stream = container.add_stream("pcm_f32le", rate=audio_samples.SAMPLING_RATE, layout="mono")
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples, dtype=np.float32)[None, :], format="flt",
                                           layout="mono")
        frame.sample_rate = audio_samples.SAMPLING_RATE
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return out.getvalue()


def media_kwargs(request: EngineRequest, decoded: dict[str, list[Any]] | None = None) -> dict[str, Any]:
    """``input_ids``, ``image_data``, ``video_data``, ``audio_data`` and ``mm_hashes`` for
    ``Engine.async_generate`` (empty without media). ``decoded``: ``decode(request.media)``, run here when not
    given.

    Only what the card declares reaches here: the worker service refuses the rest.
    """
    media = request.media
    if not media:
        return {}
    unplaced = [item.modality for item in media if item.token_count <= 0]
    if unplaced:
        # SGLang places nothing itself from token ids: an item without its run would have no place.
        raise RequestRejected(f"a {unplaced[0]} has no placeholder tokens in the prompt")
    by_modality = {m: [item for item in media if item.modality == m] for m in ITEM_ORDER}
    if decoded is None:
        decoded = decode(media)
    kwargs: dict[str, Any] = {"input_ids": engine_token_ids(request.token_ids, media)}
    if by_modality["image"]:
        kwargs["image_data"] = [item.content for item in by_modality["image"]]
    for modality in DECODED:
        if by_modality[modality]:
            kwargs[f"{modality}_data"] = list(decoded[modality])
    hashes = [item.content_hash for item in by_modality["image"]]
    if bundled(kwargs.get("video_data", ())):
        hashes.append(bundle_hash([item.content_hash for item in by_modality["video"]]))
    else:
        hashes += [item.content_hash for item in by_modality["video"]]
    hashes += [item.content_hash for item in by_modality["audio"]]
    kwargs["mm_hashes"] = [f"{h:016x}" for h in hashes]
    return kwargs


def bundled(videos: Sequence[np.ndarray], temporal_patch_size: int = 2) -> bool:
    """Whether SGLang keeps these videos (sampled frames) as one item: more than one, not all one patch each."""
    return len(videos) > 1 and any(-(-len(frames) // temporal_patch_size) > 1 for frames in videos)


def bundle_hash(content_hashes: Sequence[int]) -> int:
    """The item hash of videos SGLang holds as one item: theirs, combined (no content hash it could be taken for)."""
    digest = hashlib.blake2b(b"sglang-video-bundle", digest_size=8)
    for content_hash in content_hashes:
        digest.update(content_hash.to_bytes(8, "big"))
    return int.from_bytes(digest.digest(), "big")
