"""The contract between a media worker's gRPC glue and its engine (the simulator, diffusers, ...).

An engine is blocking code (a torch pipeline, or the simulator's sleeps), so the glue runs
``generate`` in a thread and turns what it yields into ``GenerateMediaResponse`` events: it encodes
previews and outputs in the request's format, cuts them into chunks and reports progress. The engine
knows nothing of gRPC, encodings or chunking; the glue nothing of denoising.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from typing import Literal, Protocol

from PIL import Image

from services.common.discovery import MediaLimits


@dataclasses.dataclass(frozen=True)
class MediaJob:
    """One request, checked against the engine's limits by the gateway, decoded by the glue."""

    kind: Literal["image", "video"]
    prompt: str
    negative_prompt: str
    width: int
    height: int
    n: int  # outputs; output i is generated from seed + i
    steps: int
    guidance_scale: float | None  # None: the engine's default
    seed: int
    input_image: Image.Image | None  # image-to-image, an edit's source, a video's first frame
    mask: Image.Image | None  # an edit's mask: transparent where to paint
    num_frames: int  # frames per video; 0 for images
    fps: float  # 0 for images
    partial_images: int  # previews per output (0-3)


@dataclasses.dataclass(frozen=True)
class StepDone:
    """A denoising step finished; counted across the whole request (every output's steps)."""

    step: int
    total_steps: int


@dataclasses.dataclass(frozen=True)
class Preview:
    """A partial image of output ``index`` while it denoises."""

    index: int
    partial_index: int
    image: Image.Image


@dataclasses.dataclass(frozen=True)
class Output:
    """Output ``index`` done: one frame for an image, ``num_frames`` for a video."""

    index: int
    frames: list[Image.Image]


MediaEvent = StepDone | Preview | Output


class MediaEngine(Protocol):
    """What a media worker kind implements; the glue is services/workers/media/service.py."""

    limits: MediaLimits  # what the worker's card advertises; the gateway enforces it

    def generate(self, job: MediaJob, cancelled: threading.Event) -> Iterator[MediaEvent]:
        """Runs in a thread of its own. Yields outputs in index order, each after its steps.

        Checks ``cancelled`` between denoising steps and returns early once it is set, so that a
        client that hangs up frees the engine within a step. The same job gives the same pixels.
        """
        ...

    def count_tokens(self, prompt: str) -> int:
        """Prompt tokens as the engine's text encoder counts them (usage.input_tokens)."""
        ...
