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

Both parse into ``VideoParams`` (what the client gave); services/gateway/media/video_spec.py's ``resolve``
then checks it against the model's ``MediaLimits`` and fills the defaults, giving the ``VideoSpec`` a job
runs. The prompt, the inline image, the size and the checks against the model's limits that the Images API
makes too are services/gateway/media/request_fields.py's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import orjson

from services.common.errors import InvalidRequest
from services.gateway.core.fields import INT64, UINT32, Fields, check_float
from services.gateway.core.request import load_json
from services.gateway.media import request_fields
from services.gateway.media.multipart import Form, FormFields, text_object
from services.gateway.media.video_spec import MAX_FPS, VideoParams

VIDEO_FORMATS = ("mp4", "mjpeg")
RESPONSE_FORMATS = ("url", "b64_json")
# What makes a JSON body on POST /v1/videos Dynamo's synchronous shape rather than an OpenAI job.
SYNC_MARKERS = ("response_format", "output_format", "nvext", "stream")
MAX_GUIDANCE = 100.0


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
