"""One video request, checked: what the client asked for (``VideoParams``), checked against the model's
``MediaLimits`` with every default filled (``resolve`` -> ``VideoSpec``), and the worker's request for it.

Both the Videos API (services/gateway/videos/request.py parses its two shapes into ``VideoParams``) and
KServe's video models (services/gateway/kserve/media.py) generate from a ``VideoSpec``, so the checks
and their messages are one. ``seconds``, ``fps`` and ``num_frames`` must agree: num_frames =
round(seconds * fps); two given that disagree are a 400 naming both, and the one left out follows from
the others.
"""

from __future__ import annotations

import base64
import dataclasses
import secrets
from typing import Any

from meshfront.worker.v1 import media_pb2

from services.common.discovery import MediaLimits
from services.common.errors import InvalidRequest
from services.gateway.media import request_fields

MAX_FPS = 120.0
# A seed the gateway draws fits int64 (JSON readers in other languages, the job record), well inside uint64.
SEED_BITS = 62


@dataclasses.dataclass(frozen=True)
class VideoParams:
    """One request as the client gave it (None: not given), before the model's limits are applied."""

    model: str
    prompt: str
    seconds: float | None = None
    size: str | None = None
    input_image: bytes = b""
    fps: float | None = None
    num_frames: int | None = None
    negative_prompt: str = ""
    steps: int | None = None
    guidance_scale: float | None = None
    seed: int | None = None
    output_format: str = "mp4"
    response_format: str = "url"
    stream: bool = False
    user: str | None = None


@dataclasses.dataclass(frozen=True)
class VideoSpec:
    """A checked request with every default filled: what the worker is asked for (and a job stores)."""

    model: str
    prompt: str
    width: int
    height: int
    fps: float
    num_frames: int
    steps: int
    seed: int
    output_format: str = "mp4"
    negative_prompt: str = ""
    guidance_scale: float | None = None
    input_image: bytes = b""

    @property
    def seconds(self) -> float:
        return self.num_frames / self.fps

    @property
    def size(self) -> str:
        return f"{self.width}x{self.height}"

    def to_record(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["input_image"] = base64.b64encode(self.input_image).decode()
        return d

    @classmethod
    def from_record(cls, d: dict[str, Any]) -> VideoSpec:
        return cls(**{**d, "input_image": base64.b64decode(d["input_image"])})



def check_size(size: str | None, limits: MediaLimits) -> tuple[int, int]:
    """(width, height) of a "WxH" size within the model's limits; the model's default when None."""
    if size is None:
        return limits.default_width, limits.default_height
    w, h = request_fields.parse_size(size)
    request_fields.check_size(w, h, limits)
    return w, h


def _timing(p: VideoParams, limits: MediaLimits) -> tuple[float, int]:
    """(fps, num_frames) from whichever of seconds, fps and num_frames were given; they must agree."""
    seconds, fps, frames = p.seconds, p.fps, p.num_frames
    if seconds is not None and fps is not None and frames is not None:
        if frames != round(seconds * fps):
            raise InvalidRequest(f"'seconds' ({seconds:g}), 'nvext.fps' ({fps:g}) and 'nvext.num_frames' ({frames}) "
                                 f"disagree: num_frames must be round(seconds * fps) = {round(seconds * fps)}",
                                 param="nvext.num_frames")
    elif seconds is not None and frames is not None:
        fps = frames / seconds
        if fps > MAX_FPS:
            raise InvalidRequest(f"'seconds' ({seconds:g}) and 'nvext.num_frames' ({frames}) make {fps:g} fps; "
                                 f"at most {MAX_FPS:g}", param="nvext.num_frames")
    else:
        fps = fps if fps is not None else limits.default_fps
        if frames is None:
            frames = round(seconds * fps) if seconds is not None else limits.default_frames
    if frames < 1:
        raise InvalidRequest(f"'seconds' ({seconds:g}) at {fps:g} fps is less than one frame", param="seconds")
    if frames > limits.max_frames:
        param = "nvext.num_frames" if p.num_frames is not None else "seconds"
        raise InvalidRequest(f"{frames} frames ({frames / fps:g} s at {fps:g} fps) is more than this model's "
                             f"{limits.max_frames}", param=param)
    return fps, frames


def resolve(p: VideoParams, limits: MediaLimits) -> VideoSpec:
    """Checks ``p`` against the model's limits and fills what it left out (the seed too: drawn here)."""
    width, height = check_size(p.size, limits)
    fps, frames = _timing(p, limits)
    steps = request_fields.check_steps(p.steps if p.steps is not None else limits.default_steps, limits)
    request_fields.check_output_format(p.output_format, limits)
    request_fields.check_input_image(p.input_image, limits, "input_reference")
    seed = p.seed if p.seed is not None else secrets.randbits(SEED_BITS)
    return VideoSpec(model=p.model, prompt=p.prompt, width=width, height=height, fps=fps, num_frames=frames,
                     steps=steps, seed=seed, output_format=p.output_format, negative_prompt=p.negative_prompt,
                     guidance_scale=p.guidance_scale, input_image=p.input_image)


def media_request(spec: VideoSpec, request_id: str) -> media_pb2.GenerateMediaRequest:
    """The media worker's request for one checked video."""
    req = media_pb2.GenerateMediaRequest(
        request_id=request_id, model=spec.model, kind=media_pb2.MEDIA_KIND_VIDEO, prompt=spec.prompt,
        negative_prompt=spec.negative_prompt, width=spec.width, height=spec.height, n=1,
        num_inference_steps=spec.steps, seed=spec.seed, input_image=spec.input_image,
        output_format=spec.output_format, num_frames=spec.num_frames, fps=spec.fps)
    if spec.guidance_scale is not None:
        req.guidance_scale = spec.guidance_scale
    return req
