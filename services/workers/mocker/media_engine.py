"""The mocker's media kind: a ``MediaEngine`` that draws images and video frames with Pillow.

What it draws is a pure function of the job: output ``i`` of a request comes from ``seed + i``, the
prompt and the negative prompt (hashed together), so the same request gives the same bytes and
another seed other bytes. An output is a two-colour gradient with a few shapes on it and the start of
the prompt written across the bottom; in a video the shapes move and the colours turn from frame to
frame. The background is straight alpha (its colour kept, its alpha 0), so an opaque request shows it
and a transparent one (PNG, WebP) keeps only the shapes and the text (services/workers/media/encode.py).

Image-to-image derives from the input: the input, resized, under a faint copy of what the prompt
draws; with a mask, the prompt's drawing only where the mask is transparent. A video's first frame is
the input image, and the later frames turn into the drawing.

Each denoising step waits ``step_ms / speedup_ratio`` (on the cancel event, so a cancel ends the
wait at once) and returns early once ``cancelled`` is set; previews come at evenly spaced steps,
the drawing showing through noise as the steps go. ``noise=True`` draws seeded noise instead: every
byte incompressible, for tests and benchmarks of large outputs.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import math
import random
import re
import threading
import time
from collections.abc import Iterator

from PIL import Image, ImageDraw, ImageFont

from services.workers.media.engine import MediaEvent, MediaJob, Output, Preview, StepDone
from services.workers.mocker.media_config import MediaSimConfig

# What the simulator counts as a prompt token: a word or a punctuation mark (usage.input_tokens).
_TOKEN = re.compile(r"\w+|[^\w\s]")
_NOISE_CELL = 8  # previews' noise is drawn at 1/8 size and scaled up: cheap, and still plainly noise


class SimulatedMediaEngine:
    """``MediaEngine`` (services/workers/media/engine.py) drawn with Pillow."""

    def __init__(self, cfg: MediaSimConfig):
        self.cfg = cfg
        self.limits = cfg.limits
        # Read by tests: every step taken, and when the last one ended (time.monotonic()).
        self.steps_taken = 0
        self.last_step_at = 0.0

    def count_tokens(self, prompt: str) -> int:
        return len(_TOKEN.findall(prompt))

    def generate(self, job: MediaJob, cancelled: threading.Event) -> Iterator[MediaEvent]:
        total = job.steps * job.n
        previews = preview_steps(job.steps, job.partial_images)
        count = job.num_frames if job.kind == "video" else 1
        per_step = -(-count // job.steps)
        for index in range(job.n):
            rng = random.Random(_seed(job, index))
            noise = _noise(job.width, job.height, rng)
            # Frames are drawn a share per step, so that a cancel never waits for a whole video's drawing.
            pending, frames = self._draw(job, rng), list[Image.Image]()
            for step in range(1, job.steps + 1):
                if cancelled.wait(self.cfg.step_s):  # True once set: at once, whatever is left of the wait
                    return
                frames += itertools.islice(pending, per_step)
                self.steps_taken += 1
                self.last_step_at = time.monotonic()
                yield StepDone(step=index * job.steps + step, total_steps=total)
                for partial_index in (i for i, s in enumerate(previews) if s == step):
                    # The drawing shows through the noise as the steps go (an image's, a video's first frame).
                    yield Preview(index, partial_index, Image.blend(noise, frames[0].convert("RGB"), step / job.steps))
            yield Output(index, frames)

    def _draw(self, job: MediaJob, rng: random.Random) -> Iterator[Image.Image]:
        """The output's frames, one at a time."""
        if self.cfg.noise:
            for _ in range(job.num_frames if job.kind == "video" else 1):
                yield Image.frombytes("RGB", (job.width, job.height), rng.randbytes(job.width * job.height * 3))
            return
        scene = _Scene.random(job, rng)
        if job.kind == "image":
            yield _derive(scene.frame(0.0), job)
            return
        last = max(job.num_frames - 1, 1)
        # Image-to-video: the first frame is the input, then the drawing takes over.
        first = None if job.input_image is None else job.input_image.convert("RGB").resize((job.width, job.height))
        for t in range(job.num_frames):
            frame = scene.frame(t / last).convert("RGB")  # RGB: a video has no alpha
            yield frame if first is None else Image.blend(first, frame, t / last)


def preview_steps(steps: int, partial_images: int) -> list[int]:
    """The step after which each preview comes: evenly spaced, the last one before the final step's
    output (``steps`` = 10, 3 previews: after steps 2, 5, 7)."""
    return [max(1, (k + 1) * steps // (partial_images + 1)) for k in range(partial_images)]


def _seed(job: MediaJob, index: int) -> int:
    key = f"{job.seed + index}\0{job.prompt}\0{job.negative_prompt}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big")


def _noise(width: int, height: int, rng: random.Random) -> Image.Image:
    w, h = max(1, width // _NOISE_CELL), max(1, height // _NOISE_CELL)
    return Image.frombytes("RGB", (w, h), rng.randbytes(w * h * 3)).resize((width, height), Image.Resampling.NEAREST)


def _derive(drawing: Image.Image, job: MediaJob) -> Image.Image:
    """Image-to-image: the input under a faint drawing, or, with a mask, the drawing where it is transparent."""
    if job.input_image is None:
        return drawing
    base = job.input_image.convert("RGB").resize((job.width, job.height))
    if job.mask is not None:
        keep = job.mask.getchannel("A").resize((job.width, job.height))  # opaque: keep; transparent: paint
        return Image.composite(base, drawing.convert("RGB"), keep)
    return Image.blend(base, drawing.convert("RGB"), 0.3)


@dataclasses.dataclass(frozen=True)
class _Shape:
    box: tuple[float, float, float, float]  # x, y, w, h as fractions of the frame
    velocity: tuple[float, float]  # frames' worth of travel across the video, as fractions
    colour: tuple[int, int, int]
    ellipse: bool


@dataclasses.dataclass(frozen=True)
class _Scene:
    width: int
    height: int
    colours: tuple[tuple[int, int, int], tuple[int, int, int]]
    shapes: tuple[_Shape, ...]
    caption: str

    @classmethod
    def random(cls, job: MediaJob, rng: random.Random) -> _Scene:
        def colour() -> tuple[int, int, int]:
            return rng.randrange(256), rng.randrange(256), rng.randrange(256)

        shapes = tuple(_Shape((rng.random() * 0.7, rng.random() * 0.7, 0.1 + rng.random() * 0.3,
                               0.1 + rng.random() * 0.3), (rng.uniform(-0.3, 0.3), rng.uniform(-0.3, 0.3)),
                              colour(), rng.random() < 0.5) for _ in range(rng.randint(3, 6)))
        return cls(job.width, job.height, (colour(), colour()), shapes, job.prompt[:60])

    @functools.cached_property
    def _gradient(self) -> Image.Image:
        return Image.linear_gradient("L").resize((self.width, self.height))  # once per output, not per frame

    def frame(self, t: float) -> Image.Image:
        """The scene at time ``t`` in [0, 1]: RGBA, the gradient behind at alpha 0 (straight alpha)."""
        w, h = self.width, self.height
        # The colours turn with time: a video's frames differ even where no shape passes.
        turn = 0.5 + 0.5 * math.cos(math.pi * t)
        a, b = self.colours
        start = tuple(round(x * turn + y * (1 - turn)) for x, y in zip(a, b, strict=True))
        image = Image.composite(Image.new("RGB", (w, h), b), Image.new("RGB", (w, h), start), self._gradient)
        image.putalpha(0)
        draw = ImageDraw.Draw(image)
        for s in self.shapes:
            x, y = (s.box[0] + s.velocity[0] * t) * w, (s.box[1] + s.velocity[1] * t) * h
            box = (x, y, x + max(s.box[2] * w, 1), y + max(s.box[3] * h, 1))
            (draw.ellipse if s.ellipse else draw.rectangle)(box, fill=(*s.colour, 255))
        if self.caption and h >= 32:
            font = ImageFont.load_default(size=max(10, h // 24))
            draw.text((w * 0.03, h * 0.9), self.caption, fill=(255, 255, 255, 255), font=font,
                      stroke_width=1, stroke_fill=(0, 0, 0, 255))
        return image
