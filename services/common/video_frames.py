"""Which frames of a video a Qwen2-VL-class model sees: the one rule the preprocessor counts a video's prompt
tokens by and the vLLM worker decodes its frames by, so the two agree on every clip.

The rule is qwen-vl-utils' (Qwen2-VL's reference video pipeline): 2 frames a second of the clip, at least 4
and at most 768 and never more than the clip has, rounded down to whole temporal patches (2 frames), spread
evenly from the first frame to the last. A clip shorter than one temporal patch gives one patch (its frame
repeated). Both sides count a clip's frames the same way, from its packets (one per frame) without decoding,
and read its duration from the stream (else the container), so the same bytes give the same frames.
"""

from __future__ import annotations

import io
import math

import av
import numpy as np

FPS = 2.0
MIN_FRAMES = 4
MAX_FRAMES = 768


def measure(container: av.container.InputContainer) -> tuple[int, float]:
    """``(frames, duration_s)`` of the first video stream, counting its packets; rewinds nothing (call first)."""
    stream = container.streams.video[0]
    duration = float(stream.duration * stream.time_base) if stream.duration and stream.time_base else 0.0
    if not duration and container.duration:
        duration = container.duration / av.time_base
    frames = sum(1 for packet in container.demux(stream) if packet.size)
    return frames, duration


def sampled_count(frames: int, duration_s: float, temporal_patch_size: int = 2) -> int:
    """How many frames of a ``frames``-frame, ``duration_s``-second clip the model sees."""
    wanted = duration_s * FPS if duration_s > 0 else frames
    n = min(max(wanted, MIN_FRAMES), MAX_FRAMES, frames)
    n = math.floor(n / temporal_patch_size) * temporal_patch_size
    return max(n, temporal_patch_size)


def sampled_indices(frames: int, count: int) -> list[int]:
    """``count`` frame indices spread evenly over ``frames`` frames, first and last included."""
    if count <= 1 or frames <= 1:
        return [0] * count
    return [round(i * (frames - 1) / (count - 1)) for i in range(count)]


def decode_sampled(raw: bytes, temporal_patch_size: int = 2) -> np.ndarray:
    """The sampled frames of a video's bytes as one ``(frames, height, width, 3)`` uint8 RGB array.

    Only the sampled frames are kept as pixels: a long clip's other frames are decoded and dropped.
    """
    with av.open(io.BytesIO(raw), mode="r") as container:
        frames, duration = measure(container)
    indices = sampled_indices(frames, sampled_count(frames, duration, temporal_patch_size))
    wanted = set(indices)
    kept: dict[int, np.ndarray] = {}
    with av.open(io.BytesIO(raw), mode="r") as container:
        for i, frame in enumerate(container.decode(container.streams.video[0])):
            if i in wanted:
                kept[i] = frame.to_ndarray(format="rgb24")
            if i >= indices[-1]:
                break
    if not kept:
        raise ValueError("the video has no decodable frames")
    last = kept[max(kept)]
    # A packet that decodes to no frame shortens the clip: its sampled index takes the last frame decoded.
    return np.stack([kept.get(i, last) for i in indices])
