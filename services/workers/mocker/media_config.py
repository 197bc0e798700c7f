"""The mocker's media flags: ``--media image|video`` turns the mocker into an image or video simulator
(services/workers/mocker/media_engine.py) behind MediaService, with the limits its card advertises.

Every flag has a ``MESHFRONT_MOCKER_*`` env twin. A limit left at its default takes the kind's own:
images up to 2048x2048 (1024x1024 by default), videos up to 1280x1280 (1280x720, 32 frames at 8 fps by
default, at most 120 frames): a video's frames are all held at once, as a real pipeline's are.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from services.common.discovery import MediaLimits
from services.common.flags import FlagParser
from services.workers.media.config import limit_errors, parse_size
from services.workers.media.encode import IMAGE_CONTENT_TYPES, VIDEO_CONTENT_TYPES

KINDS = ("image", "video")
# The kinds' own defaults, for a flag left empty or at 0.
DEFAULTS = {
    "image": MediaLimits(max_width=2048, max_height=2048, default_width=1024, default_height=1024, max_n=10,
                         default_steps=20, max_steps=100, output_formats=tuple(IMAGE_CONTENT_TYPES), takes_image=True),
    "video": MediaLimits(max_width=1280, max_height=1280, default_width=1280, default_height=720, max_n=4,
                         default_steps=20, max_steps=100, output_formats=tuple(VIDEO_CONTENT_TYPES),
                         default_fps=8.0, max_frames=120, default_frames=32, takes_image=True),
}


@dataclasses.dataclass(frozen=True)
class MediaSimConfig:
    """The simulated media engine: what it makes, its limits, and how long a step takes."""

    kind: str  # "image" | "video"
    limits: MediaLimits
    step_ms: float = 50.0
    speedup_ratio: float = 1.0  # divides step_ms; 0 = no waiting at all
    noise: bool = False

    @property
    def step_s(self) -> float:
        return 0.0 if self.speedup_ratio == 0 else self.step_ms / 1000.0 / self.speedup_ratio


def add_media_flags(p: FlagParser) -> None:
    p.add("--media", default="", choices=("", *KINDS),
          help="simulate an image or video model (MediaService, registered for /v1/images or /v1/videos) instead "
               "of a text model; --model-dir is then optional")
    p.add("--media-step-ms", default=50.0, type=float,
          help="milliseconds per simulated denoising step (divided by --speedup-ratio)")
    p.add("--media-noise", default=False, type=bool,
          help="draw seeded noise instead of shapes: incompressible outputs (tests of large results)")
    p.add("--media-max-size", default="", help="largest WxH (default: 2048x2048 images, 1280x1280 videos)")
    p.add("--media-default-size", default="", help="WxH when a request gives none (default: 1024x1024, 1280x720)")
    p.add("--media-size-multiple", default=8, type=int, help="width and height are multiples of this")
    p.add("--media-max-n", default=0, type=int, help="most outputs per request (default: 10 images, 4 videos)")
    p.add("--media-default-steps", default=20, type=int, help="denoising steps when a request gives none")
    p.add("--media-max-steps", default=100, type=int, help="most denoising steps a request may ask for")
    p.add("--media-formats", default="", help="output formats, comma-separated (default: png,jpeg,webp or mp4,mjpeg)")
    p.add("--media-default-fps", default=8.0, type=float, help="videos: frames per second by default")
    p.add("--media-default-frames", default=32, type=int, help="videos: frames by default")
    p.add("--media-max-frames", default=120, type=int, help="videos: most frames per video")


def media_config_from_args(args: argparse.Namespace, speedup_ratio: float, errors: list[str]) -> MediaSimConfig | None:
    """The simulator's config, or None for a text mocker; problems go to ``errors``."""
    kind = args.media
    if not kind:
        return None
    base = DEFAULTS[kind]
    max_size = parse_size(args.media_max_size, "--media-max-size", errors) if args.media_max_size else None
    default_size = (parse_size(args.media_default_size, "--media-default-size", errors)
                    if args.media_default_size else None)
    formats = tuple(f.strip() for f in args.media_formats.split(",") if f.strip()) or base.output_formats
    known = IMAGE_CONTENT_TYPES if kind == "image" else VIDEO_CONTENT_TYPES
    if any(f not in known for f in formats):
        errors.append(f"--media-formats: {kind} formats are {', '.join(known)}, got {args.media_formats!r}")
    video = kind == "video"
    changes: dict[str, Any] = {"size_multiple": args.media_size_multiple, "max_n": args.media_max_n or base.max_n,
                               "default_steps": args.media_default_steps, "max_steps": args.media_max_steps,
                               "output_formats": formats}
    if max_size:
        changes.update(max_width=max_size[0], max_height=max_size[1])
    if default_size:
        changes.update(default_width=default_size[0], default_height=default_size[1])
    if video:
        changes.update(default_fps=args.media_default_fps, default_frames=args.media_default_frames,
                       max_frames=args.media_max_frames)
    limits = dataclasses.replace(base, **changes)
    errors += limit_errors(limits, video, "--media-")
    if args.media_step_ms < 0:
        errors.append("--media-step-ms must be >= 0")
    return MediaSimConfig(kind=kind, limits=limits, step_ms=args.media_step_ms, speedup_ratio=speedup_ratio,
                          noise=args.media_noise)

