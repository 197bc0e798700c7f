"""How many prompt tokens an audio clip takes in a Qwen2-Audio-class model, from its feature extractor's config.

Qwen2-Audio's processor pads every clip to the WhisperFeatureExtractor window (``chunk_length`` seconds, cutting
what is longer) and turns it into mel frames of ``hop_length`` samples; the clip's own frames are those its
attention mask keeps, ``ceil(samples / hop_length)``. The encoder halves them twice (a stride-2 convolution, then
a 2x pooling): ``tokens = ((frames - 1) // 2 + 1 - 2) // 2 + 1``, the processor's and vLLM's formula.

A clip longer than the window is refused with a 400 rather than cut (the processor would silently drop its
end), and so is one too short to give a token. The mesh decodes every clip at 16 kHz
(services/common/audio_samples.py, the rule the vLLM worker feeds the engine by); a model whose extractor
runs at another rate gets no audio spec, and its clips are left to its engine to place.
"""

from __future__ import annotations

import dataclasses
import math

from services.common.audio_samples import SAMPLING_RATE
from services.common.errors import InvalidRequest

__all__ = ["SAMPLING_RATE", "AudioSpec", "audio_tokens", "load_audio_spec"]
WHISPER_EXTRACTOR = "WhisperFeatureExtractor"


@dataclasses.dataclass(frozen=True)
class AudioSpec:
    hop_length: int = 160
    chunk_length_s: int = 30

    @property
    def max_samples(self) -> int:
        return self.chunk_length_s * SAMPLING_RATE


def load_audio_spec(cfg: dict) -> AudioSpec | None:
    """The spec from a model's ``preprocessor_config.json``; None unless it is a WhisperFeatureExtractor at 16 kHz
    (transformers' defaults fill the keys it leaves out)."""
    if cfg.get("feature_extractor_type") != WHISPER_EXTRACTOR:
        return None
    if int(cfg.get("sampling_rate", SAMPLING_RATE)) != SAMPLING_RATE:
        return None
    base = AudioSpec()
    return AudioSpec(hop_length=int(cfg.get("hop_length", base.hop_length)),
                     chunk_length_s=int(cfg.get("chunk_length", base.chunk_length_s)))


def audio_tokens(samples: int, spec: AudioSpec) -> int:
    """The prompt tokens a clip of ``samples`` 16 kHz samples takes (see the module doc); 400 if it cannot be used."""
    if samples > spec.max_samples:
        raise InvalidRequest(f"an audio clip is {samples / SAMPLING_RATE:.2f} s long; this model hears at most "
                             f"{spec.chunk_length_s} s of one clip", param="messages")
    frames = math.ceil(samples / spec.hop_length)
    tokens = ((frames - 1) // 2 + 1 - 2) // 2 + 1
    if tokens <= 0:
        raise InvalidRequest(f"an audio clip is {samples / SAMPLING_RATE * 1000:.1f} ms long, too short for this "
                             "model to hear", param="messages")
    return tokens
