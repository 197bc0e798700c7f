"""Video request bodies, both shapes, validated: every field read, every unknown field a 400 naming it.

Two shapes reach POST /v1/videos (docs/media.md, "Endpoints: videos"):

- OpenAI's job create (``client.videos.create``, always multipart from the SDK; a plain JSON body is
  read the same way): ``model``, ``prompt``, ``seconds`` ("4", or a number), ``size`` ("WxH"),
  ``input_reference`` (a file part, or JSON ``{"image_url": "data:image/...;base64,..."}``). The
  answer is a job (jobs.py). A multipart create takes ``nvext`` too, as the nested fields
  (``nvext[num_frames]``, ...) the SDK sends for ``extra_body={"nvext": {...}}``.
- Dynamo's synchronous ``NvCreateVideoRequest``: a JSON body that names any of ``response_format``,
  ``output_format``, ``nvext`` or ``stream`` (OpenAI's create has none of them), and every body on
  POST /v1/videos/generations. Fields: ``prompt``, ``model``, ``input_reference`` (a data URL or bare
  base64), ``seconds``, ``size``, ``user``, ``response_format`` (url | b64_json, default url),
  ``output_format`` (mp4 | mjpeg, default mp4), ``stream``, and ``nvext``: ``fps``, ``num_frames``,
  ``negative_prompt``, ``num_inference_steps``, ``guidance_scale``, ``seed``.

Both parse into ``VideoParams`` (what the client gave); ``resolve`` then checks it against the model's
``MediaLimits`` and fills the defaults, giving the ``VideoSpec`` a job runs. ``seconds``, ``fps`` and
``num_frames`` must agree: num_frames = round(seconds * fps); two given that disagree are a 400 naming
both, and the one left out follows from the others. The prompt, the inline image, the size and the checks
against the model's limits that the Images API makes too are services/gateway/media/request_fields.py's.
"""

from __future__ import annotations

import base64
import dataclasses
import secrets
from collections.abc import Mapping
from typing import Any

import orjson

from services.common.discovery import MediaLimits
from services.common.errors import InvalidRequest
from services.gateway.core.fields import INT64, UINT32, Fields, check_float
from services.gateway.core.request import load_json
from services.gateway.media import request_fields
from services.gateway.media.multipart import Form, FormFields, text_object

VIDEO_FORMATS = ("mp4", "mjpeg")
RESPONSE_FORMATS = ("url", "b64_json")
# What makes a JSON body on POST /v1/videos Dynamo's synchronous shape rather than an OpenAI job.
SYNC_MARKERS = ("response_format", "output_format", "nvext", "stream")
MAX_FPS = 120.0
MAX_GUIDANCE = 100.0
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


def is_sync_shape(body: bytes, content_type: str) -> bool:
    """The rule of POST /v1/videos: Dynamo's synchronous shape is a JSON object naming a marker field."""
    if not content_type.split(";")[0].strip().lower().endswith("json") and content_type:
        return False
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    return isinstance(parsed, dict) and any(k in parsed for k in SYNC_MARKERS)


def _seconds(v: Any) -> float | None:
    """OpenAI sends a string ("4"), Dynamo an integer; either is a positive number of seconds."""
    if v is None:
        return None
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            raise InvalidRequest(f"'seconds' must be a number of seconds; got {v!r}", param="seconds") from None
    return check_float(v, "seconds", lo=0.001)


def _openai_reference(v: Any) -> bytes:
    """A JSON create's ``input_reference``: ``{"image_url": <data URL>}`` (a file_id names OpenAI's storage)."""
    if not isinstance(v, dict):
        raise InvalidRequest("'input_reference' must be a file upload (multipart) or an object with 'image_url'",
                             param="input_reference")
    f = Fields(v, "input_reference.")
    url = f.required_str("image_url")
    f.reject_unknown()
    return request_fields.inline_image(url, "input_reference.image_url")


def form_fields(form: Form) -> tuple[dict[str, Any], dict[str, bytes]]:
    """A multipart form as (its text fields as an object, its file parts); a name given twice is a 400 naming it."""
    files: dict[str, bytes] = {}
    for part in form.parts:
        if part.filename is None:
            continue
        if part.name in files:
            given = len(form.all(part.name))
            raise InvalidRequest(f"'{part.name}' was given {given} times; give it once", param=part.name)
        files[part.name] = part.data
    texts = text_object(p for p in form.parts if p.filename is None)
    return texts, files


def parse_openai(form: Mapping[str, Any], files: Mapping[str, bytes]) -> VideoParams:
    """OpenAI's job create from multipart: text fields in ``form`` (``form_fields``' object), the
    ``input_reference`` upload in ``files``."""
    unknown_files = sorted(k for k in files if k != "input_reference")
    if unknown_files:
        raise InvalidRequest(f"Unsupported file part(s): {', '.join(repr(k) for k in unknown_files)}",
                             param=unknown_files[0])
    f = FormFields(dict(form))
    params = VideoParams(model=f.required_str("model"), prompt=request_fields.prompt(f),
                         seconds=_seconds(f.str("seconds")), size=f.str("size"),
                         input_image=files.get("input_reference", b""), **_nvext(f.nested("nvext")))
    ref = f.raw("input_reference")
    if ref is not None:  # a text part: an image_url object, as JSON text or as input_reference[image_url]
        if params.input_image:
            raise InvalidRequest("'input_reference' is given twice", param="input_reference")
        if isinstance(ref, str):
            try:
                ref = orjson.loads(ref)
            except orjson.JSONDecodeError:
                raise InvalidRequest("'input_reference' must be a file upload or a JSON object with 'image_url'",
                                     param="input_reference") from None
        params = dataclasses.replace(params, input_image=_openai_reference(ref))
    f.reject_unknown()
    return params


def parse_openai_json(raw: bytes) -> VideoParams:
    """OpenAI's job create sent as JSON (no file): the same fields."""
    body = load_json(raw)
    f = Fields(body)
    model, prompt = f.required_str("model"), request_fields.prompt(f)
    seconds = _seconds(f.raw("seconds"))
    size = f.str("size")
    ref = f.raw("input_reference")
    f.reject_unknown()
    return VideoParams(model=model, prompt=prompt, seconds=seconds, size=size,
                       input_image=_openai_reference(ref) if ref is not None else b"")


def parse_sync(raw: bytes) -> VideoParams:
    """Dynamo's ``NvCreateVideoRequest``."""
    body = load_json(raw)
    f = Fields(body)
    model, prompt = f.required_str("model"), request_fields.prompt(f)
    seconds = _seconds(f.raw("seconds"))
    size = f.str("size")
    ref = f.raw("input_reference")
    image = request_fields.inline_image(ref, "input_reference") if ref is not None else b""
    user = f.str("user")
    response_format = f.str("response_format", allowed=RESPONSE_FORMATS) or "url"
    output_format = f.str("output_format", allowed=VIDEO_FORMATS) or "mp4"
    stream = f.bool("stream")
    nvext = _nvext(f.nested("nvext"))
    f.reject_unknown()
    return VideoParams(model=model, prompt=prompt, seconds=seconds, size=size, input_image=image,
                       output_format=output_format, response_format=response_format, stream=stream, user=user,
                       **nvext)


def _nvext(n: Fields | None) -> dict[str, Any]:
    """Dynamo's extensions (either shape), as ``VideoParams`` fields; absent, the defaults."""
    if n is None:
        return {}
    out = {"fps": n.float("fps", lo=0.001, hi=MAX_FPS),
           "num_frames": n.int("num_frames", UINT32, lo=1),
           "negative_prompt": n.str("negative_prompt") or "",
           "steps": n.int("num_inference_steps", UINT32, lo=1),
           "guidance_scale": n.float("guidance_scale", lo=0.0, hi=MAX_GUIDANCE),
           "seed": n.int("seed", INT64, lo=0)}
    n.reject_unknown()
    return out


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
