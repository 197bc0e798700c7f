"""Schemas of the video routes: OpenAI's job create and job objects, Dynamo's synchronous request and answer.

The request schemas list exactly the fields services/gateway/videos/request.py accepts
(tests/unit/gateway/test_videos_request.py checks them against the parsers).
"""

from __future__ import annotations

from services.gateway.http_api.schema import Schema, array, boolean, integer, number, obj, one_of, string
from services.gateway.videos.request import RESPONSE_FORMATS, VIDEO_FORMATS

_SIZE = string("WIDTHxHEIGHT in pixels, within the model's limits and a multiple of its size step")
_SECONDS = one_of(string(), number(minimum=0.001),
                  description="Clip length; with nvext.fps and nvext.num_frames, num_frames = round(seconds * fps)")

VIDEO_NVEXT = obj({
    "fps": number("Frames per second (model default when left out)", minimum=0.001, maximum=120),
    "num_frames": integer("Frames (at most the model's max_frames)", minimum=1),
    "negative_prompt": string("What to steer away from"),
    "num_inference_steps": integer("Denoising steps (at most the model's max_steps)", minimum=1),
    "guidance_scale": number("Classifier-free guidance", minimum=0, maximum=100),
    "seed": integer("Same seed, same request: same bytes (drawn by the gateway when left out)", minimum=0),
}, "Dynamo's video extensions")

VIDEO_CREATE_REQUEST = obj({
    "model": string(), "prompt": string(), "seconds": _SECONDS, "size": _SIZE,
    "input_reference": one_of(
        obj({"image_url": string("A data:image/...;base64 URL")}, required=("image_url",)),
        string("Dynamo's shape: a data URL or bare base64 of the first frame"),
        description="The first frame (image-to-video; multipart: a file part)"),
    "user": string("Dynamo's shape only"),
    "response_format": string("Dynamo's shape: how the video comes back", enum=RESPONSE_FORMATS),
    "output_format": string("Dynamo's shape: the container", enum=VIDEO_FORMATS),
    "stream": boolean("Dynamo's shape: progress events, then the answer, as SSE"),
    "nvext": VIDEO_NVEXT,
}, "OpenAI's job create (multipart/form-data as the SDK sends it, or JSON: model, prompt, seconds, size, "
   "input_reference) or Dynamo's NvCreateVideoRequest (JSON naming response_format, output_format, nvext or "
   "stream)", required=("model", "prompt"))

VIDEO_ERROR = obj({"code": string(), "message": string()}, nullable=True)
VIDEO_JOB = obj({
    "id": string("video_..."), "object": string(enum=("video",)), "created_at": integer(),
    "status": string(enum=("queued", "in_progress", "completed", "failed")),
    "progress": integer(minimum=0, maximum=100), "completed_at": integer(nullable=True),
    "expires_at": integer(nullable=True), "model": string(), "prompt": string(nullable=True),
    "seconds": string(), "size": string(), "error": VIDEO_ERROR,
    "remixed_from_video_id": string(nullable=True),
}, "OpenAI's video job", required=("id", "object", "created_at", "status", "progress", "model", "seconds",
                                   "size"))
VIDEO_LIST = obj({"object": string(enum=("list",)), "data": array(VIDEO_JOB),
                  "first_id": string(nullable=True), "last_id": string(nullable=True), "has_more": boolean()},
                 required=("object", "data", "has_more"))
VIDEO_DELETED = obj({"id": string(), "object": string(enum=("video.deleted",)), "deleted": boolean()},
                    required=("id", "object", "deleted"))
VIDEO_GENERATION = obj({
    "id": string(), "object": string(enum=("video",)), "model": string(),
    "status": string(enum=("completed", "in_progress")), "progress": integer(minimum=0, maximum=100),
    "created": integer(),
    "data": array(obj({"output_format": string(enum=VIDEO_FORMATS), "fps": number(),
                       "url": string("GET it within the media TTL"), "b64_json": string()})),
    "inference_time_s": number(),
}, "Dynamo's synchronous answer (streamed: in_progress events carry no data)", required=(
    "id", "object", "model", "status", "progress", "created"))

SCHEMAS: dict[str, Schema] = {
    "VideoCreateRequest": VIDEO_CREATE_REQUEST, "VideoJob": VIDEO_JOB, "VideoList": VIDEO_LIST,
    "VideoDeleted": VIDEO_DELETED, "VideoGeneration": VIDEO_GENERATION,
}
