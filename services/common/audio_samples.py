"""An ``input_audio`` clip as the samples a Qwen2-Audio-class model hears: the one decoder the preprocessor counts
the clip's prompt tokens by and the vLLM worker feeds the engine by, so the two agree on every clip.

PyAV (FFmpeg) reads the container its ``input_audio.format`` names (wav or mp3; other bytes are refused) and
libswresample mixes it to mono and resamples it to the model's rate as float32 samples in [-1, 1]. The same
bytes give the same samples on both sides (same library, same settings), hence the same token count. vLLM
gets them at the model's rate, so it resamples nothing.
"""

from __future__ import annotations

import io

import av
import numpy as np

# The rate every clip is decoded at: Whisper's, and every Qwen2-Audio's (media/audio.py checks the model's).
SAMPLING_RATE = 16000
# input_audio.format -> the FFmpeg demuxer that must read it (the gateway accepts only these).
DEMUXERS = {"wav": "wav", "mp3": "mp3"}


class AudioRefused(ValueError):
    """The bytes are not a usable clip in the named format; the message says why."""


def decode(raw: bytes, fmt: str, rate: int, max_seconds: float) -> np.ndarray:
    """The clip's first audio stream as mono float32 samples at ``rate`` Hz.

    Refuses (AudioRefused) bytes FFmpeg cannot read as ``fmt``, a clip with no audio stream or no samples,
    and one longer than ``max_seconds``, counted while decoding so that a long clip is not decoded whole.
    """
    demuxer = DEMUXERS.get(fmt)
    if demuxer is None:
        raise AudioRefused(f"its format {fmt!r} is not one of {', '.join(DEMUXERS)}")
    limit = int(max_seconds * rate)
    chunks: list[np.ndarray] = []
    total = 0
    try:
        with av.open(io.BytesIO(raw), mode="r", format=demuxer) as container:
            if not container.streams.audio:
                raise AudioRefused("it has no audio stream")
            resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
            for frame in _resampled(container.decode(container.streams.audio[0]), resampler):
                chunk = frame.to_ndarray().reshape(-1)
                total += len(chunk)
                if total > limit:
                    raise AudioRefused(f"it is longer than the {max_seconds:g}-second limit")
                chunks.append(chunk)
    except AudioRefused:
        raise
    except (av.FFmpegError, ValueError, OSError):
        raise AudioRefused(f"it is not {fmt} audio this service can decode") from None
    if not total:
        raise AudioRefused("it has no audio samples")
    return np.concatenate(chunks).astype(np.float32, copy=False)


def _resampled(frames, resampler: av.AudioResampler):
    """The resampler's output frames, lazily (so the length check stops decoding), then what it buffered."""
    for frame in frames:
        yield from resampler.resample(frame)
    yield from resampler.resample(None)
