"""How many prompt tokens an image or video takes, and placing them in the prompt's token ids.

The counts follow Qwen2-VL's image processor (``smart_resize``): the image is resized to multiples of
patch_size x merge_size (28 px) with its pixel count kept within [min_pixels, max_pixels], and each
28 x 28 tile becomes one token. A video's frames are sampled by services/common/video_frames.py (2 a
second, the rule the vLLM worker decodes by), two frames per temporal patch, each frame resized within the
video processor's pixel bounds. The bounds come from the model directory as transformers reads them: images
from ``preprocessor_config.json``; videos from ``video_preprocessor_config.json``, else from
``preprocessor_config.json`` too (transformers' fallback), else Qwen2-VL's video defaults. An audio clip's
count follows Qwen2-Audio's processor (media/audio.py), from the same ``preprocessor_config.json``.

The chat template renders each image as one ``<|image_pad|>`` (video: ``<|video_pad|>``, audio: ``<|AUDIO|>``);
placing expands
the n-th placeholder of a modality into the n-th item's token count, as vLLM's processor does, so the
router's block hashes, the worker's KV cache and ``usage.prompt_tokens`` all see the real prompt.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer

from services.common import video_frames
from services.common.errors import InvalidRequest
from services.preprocessor.media.audio import AudioSpec, audio_tokens, load_audio_spec

PLACEHOLDERS = {"image": "<|image_pad|>", "video": "<|video_pad|>", "audio": "<|AUDIO|>"}
# What a template that renders no media parts gets in their place (Qwen2-VL's and Qwen2-Audio's own rendering).
MARKERS = {"image": "<|vision_start|><|image_pad|><|vision_end|>",
           "video": "<|vision_start|><|video_pad|><|vision_end|>",
           "audio": "<|audio_bos|><|AUDIO|><|audio_eos|>"}
MAX_ASPECT_RATIO = 200
# Qwen2VLVideoProcessor's bounds, for a model directory that configures no video processor.
VIDEO_MIN_PIXELS = 128 * 28 * 28
VIDEO_MAX_PIXELS = 768 * 28 * 28


@dataclasses.dataclass(frozen=True)
class VisionSpec:
    """A model's image geometry and placeholder ids (None: its tokenizer has no such placeholder)."""

    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 14 * 14 * 4 * 16384  # Qwen2-VL's preprocessor_config.json: 12845056
    video_min_pixels: int = VIDEO_MIN_PIXELS
    video_max_pixels: int = VIDEO_MAX_PIXELS
    placeholder_ids: dict[str, int] = dataclasses.field(default_factory=dict)
    # Audio's feature geometry (None: the model's processor is not Qwen2-Audio's, and audio is not placed).
    audio: AudioSpec | None = None

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    def markers(self) -> dict[str, str]:
        """Text standing for each modality this model can place, for templates that render no media parts."""
        return {m: MARKERS[m] for m in self.placeholder_ids}


def load_spec(model_dir: str, tokenizer: Tokenizer) -> VisionSpec:
    """The spec from the model's processor configs (see the module doc) and its tokenizer's placeholder tokens."""
    ids = {m: i for m, tok in PLACEHOLDERS.items() if (i := tokenizer.token_to_id(tok)) is not None}
    cfg = _read_config(Path(model_dir) / "preprocessor_config.json")
    audio = load_audio_spec(cfg)
    if audio is None:
        ids.pop("audio", None)  # a placeholder it cannot count for is left to the engine to expand
    video_path = Path(model_dir) / "video_preprocessor_config.json"
    video_cfg = _read_config(video_path) if video_path.is_file() else cfg
    base = VisionSpec()
    min_pixels, max_pixels = _pixel_bounds(cfg, base.min_pixels, base.max_pixels)
    video_min, video_max = _pixel_bounds(video_cfg, VIDEO_MIN_PIXELS, VIDEO_MAX_PIXELS)
    return VisionSpec(patch_size=int(cfg.get("patch_size", base.patch_size)),
                      merge_size=int(cfg.get("merge_size", base.merge_size)),
                      temporal_patch_size=int(cfg.get("temporal_patch_size", base.temporal_patch_size)),
                      min_pixels=min_pixels, max_pixels=max_pixels, video_min_pixels=video_min,
                      video_max_pixels=video_max, placeholder_ids=ids, audio=audio)


def _read_config(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _pixel_bounds(cfg: dict, default_min: int, default_max: int) -> tuple[int, int]:
    """A processor config's (min_pixels, max_pixels): its own keys win over ``size`` (as transformers' do)."""
    size: dict = cfg["size"] if isinstance(cfg.get("size"), dict) else {}
    return (int(cfg.get("min_pixels", size.get("shortest_edge", default_min))),
            int(cfg.get("max_pixels", size.get("longest_edge", default_max))))


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's resize: both sides multiples of ``factor``, the area within the bounds, the aspect kept."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(f"its aspect ratio is over {MAX_ASPECT_RATIO}")
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def image_tokens(width: int, height: int, spec: VisionSpec) -> int:
    h, w = smart_resize(height, width, spec.factor, spec.min_pixels, spec.max_pixels)
    return (h // spec.factor) * (w // spec.factor)


def video_tokens(width: int, height: int, frames: int, duration_s: float, spec: VisionSpec) -> int:
    sampled = video_frames.sampled_count(frames, duration_s, spec.temporal_patch_size)
    h, w = smart_resize(height, width, spec.factor, spec.video_min_pixels, spec.video_max_pixels)
    return (sampled // spec.temporal_patch_size) * (h // spec.factor) * (w // spec.factor)


@dataclasses.dataclass(frozen=True)
class Placed:
    """Where an item's placeholder run sits; (0, 0) when it is not placed."""

    offset: int
    count: int


def expand(token_ids: list[int], items: Sequence[tuple[str, int]], spec: VisionSpec) -> tuple[list[int], list[Placed]]:
    """``token_ids`` with the n-th placeholder of each modality expanded to the n-th such item's count.

    ``items`` are ``(modality, tokens)`` in prompt order; a modality the model has no placeholder for is left
    unplaced. Refuses (400) a prompt whose placeholders do not match the items one to one (a client that
    typed a placeholder token as text).
    """
    out: list[int] = []
    placed: list[Placed] = []
    cursor = 0
    pads = set(spec.placeholder_ids.values())
    for modality, count in items:
        pad = spec.placeholder_ids.get(modality)
        if pad is None:
            placed.append(Placed(0, 0))
            continue
        try:
            at = token_ids.index(pad, cursor)
        except ValueError:
            raise InvalidRequest(f"the prompt has fewer {modality} placeholders than {modality} parts",
                                 param="messages") from None
        if not pads.isdisjoint(token_ids[cursor:at]):
            raise InvalidRequest("the prompt's media placeholders do not match its media parts (is a placeholder "
                                 "token written as text?)", param="messages")
        out += token_ids[cursor:at]
        placed.append(Placed(len(out), count))
        out += [pad] * count
        cursor = at + 1
    if not pads.isdisjoint(token_ids[cursor:]):
        raise InvalidRequest("the prompt has more media placeholders than media parts (is a placeholder token "
                             "written as text?)", param="messages")
    out += token_ids[cursor:]
    return out, placed


def item_tokens(modality: str, width: int, height: int, frames: int, duration_s: float, spec: VisionSpec, *,
                samples: int = 0) -> int:
    """The prompt tokens one item takes (0 for a modality the model has no placeholder for); ``samples``: an audio
    clip's, at 16 kHz."""
    if modality not in spec.placeholder_ids:
        return 0
    if modality == "audio":
        assert spec.audio is not None  # load_spec places audio only with its spec
        return audio_tokens(samples, spec.audio)
    try:
        if modality == "video":
            return video_tokens(width, height, frames, duration_s, spec)
        return image_tokens(width, height, spec)
    except ValueError as e:
        raise InvalidRequest(f"a {modality} cannot be used: {e}", param="messages") from None
