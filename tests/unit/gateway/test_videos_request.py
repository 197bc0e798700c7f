"""Video request bodies at the gateway: the two shapes and the rule between them, the model's limits,
seconds/fps/num_frames agreement, the model check, and the synchronous answer's streamed base64."""

from __future__ import annotations

import base64

import orjson
import pytest

from services.common.discovery import CHAT, COMPLETIONS, IMAGES, VIDEOS, MediaLimits, ModelCard, WorkerCard
from services.common.errors import InvalidRequest, NotFound
from services.gateway.http_api.videos_schemas import VIDEO_CREATE_REQUEST, VIDEO_NVEXT
from services.gateway.media.base64_stream import Base64Stream
from services.gateway.media.video_spec import VideoParams, VideoSpec, resolve
from services.gateway.videos.render import SyncBody
from services.gateway.videos.request import is_sync_shape, parse_openai, parse_openai_json, parse_sync
from services.gateway.videos.server import check_video_model

pytestmark = pytest.mark.unit

LIMITS = MediaLimits(max_width=512, max_height=512, size_multiple=16, default_width=256, default_height=128,
                     max_n=1, default_steps=4, max_steps=20, output_formats=("mp4", "mjpeg"), default_fps=8.0,
                     max_frames=48, default_frames=16, takes_image=True)
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5E"
                       "rkJggg==")


def sync(**body):
    return parse_sync(orjson.dumps({"model": "v", "prompt": "a cat", **body}))


def bad(fn, param: str):
    with pytest.raises(InvalidRequest) as e:
        fn()
    assert e.value.param == param, (e.value.param, e.value.message)
    return e.value.message


# ---- the rule between the shapes ---------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "ctype", "is_sync"), [
    (b'{"model":"v","prompt":"p","response_format":"url"}', "application/json", True),
    (b'{"model":"v","prompt":"p","output_format":"mp4"}', "application/json", True),
    (b'{"model":"v","prompt":"p","nvext":{}}', "application/json", True),
    (b'{"model":"v","prompt":"p","stream":false}', "application/json", True),
    (b'{"model":"v","prompt":"p","nvext":{}}', "", True),  # no content type: read as JSON, as the transcoder does
    (b'{"model":"v","prompt":"p","seconds":"4","size":"256x128"}', "application/json", False),
    (b'--b\r\nContent-Disposition: form-data; name="nvext"\r\n\r\n{}\r\n--b--\r\n', "multipart/form-data; boundary=b",
     False),
    (b'not json', "application/json", False),
    (b'["nvext"]', "application/json", False),
])
def test_which_shape(body, ctype, is_sync):
    assert is_sync_shape(body, ctype) is is_sync


# ---- OpenAI's job create -----------------------------------------------------------------------------------

def test_openai_multipart_fields():
    p = parse_openai({"model": "v", "prompt": "a cat", "seconds": "4", "size": "256x128"}, {"input_reference": PNG})
    assert p == VideoParams(model="v", prompt="a cat", seconds=4.0, size="256x128", input_image=PNG)


def test_openai_json_with_an_image_url():
    url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    p = parse_openai_json(orjson.dumps({"model": "v", "prompt": "x", "seconds": 2,
                                        "input_reference": {"image_url": url}}))
    assert p.input_image == PNG and p.seconds == 2.0


def test_openai_unknown_fields_and_files_are_refused():
    bad(lambda: parse_openai({"model": "v", "prompt": "p", "quality": "hd"}, {}), "quality")
    bad(lambda: parse_openai({"model": "v", "prompt": "p"}, {"mask": PNG}), "mask")
    bad(lambda: parse_openai({"model": "v"}, {}), "prompt")
    bad(lambda: parse_openai({"model": "v", "prompt": "p", "seconds": "four"}, {}), "seconds")
    bad(lambda: parse_openai_json(orjson.dumps({"model": "v", "prompt": "p", "input_reference": {"file_id": "f"}})),
        "input_reference.image_url")


# ---- Dynamo's synchronous shape ----------------------------------------------------------------------------

def test_sync_fields():
    p = sync(seconds=2, size="256x128", response_format="b64_json", output_format="mjpeg", stream=True, user="u",
             input_reference=base64.b64encode(PNG).decode(),
             nvext={"fps": 8, "num_frames": 16, "negative_prompt": "blur", "num_inference_steps": 3,
                    "guidance_scale": 5.5, "seed": 7})
    assert p == VideoParams(model="v", prompt="a cat", seconds=2.0, size="256x128", input_image=PNG, fps=8.0,
                            num_frames=16, negative_prompt="blur", steps=3, guidance_scale=5.5, seed=7,
                            output_format="mjpeg", response_format="b64_json", stream=True, user="u")
    assert sync().response_format == "url" and sync().output_format == "mp4"


@pytest.mark.parametrize(("body", "param"), [
    ({"response_format": "gif"}, "response_format"),
    ({"output_format": "webm"}, "output_format"),
    ({"nvext": {"fps": 0}}, "nvext.fps"),
    ({"nvext": {"num_frames": 0}}, "nvext.num_frames"),
    ({"nvext": {"num_inference_steps": 0}}, "nvext.num_inference_steps"),
    ({"nvext": {"seed": -1}}, "nvext.seed"),
    ({"nvext": {"guidance_scale": "high"}}, "nvext.guidance_scale"),
    ({"nvext": {"frames": 3}}, "nvext.frames"),
    ({"n": 2}, "n"),
    ({"input_reference": "https://example.com/a.png"}, "input_reference"),
    ({"input_reference": "%%%"}, "input_reference"),
    ({"stream": "yes"}, "stream"),
])
def test_sync_bad_fields(body, param):
    bad(lambda: sync(**body), param)


def test_request_schema_lists_exactly_the_sync_fields():
    listed = set(VIDEO_CREATE_REQUEST["properties"]) - {"model", "prompt"}
    for field in listed:
        value = {"seconds": 1, "size": "16x16", "input_reference": base64.b64encode(PNG).decode(), "user": "u",
                 "response_format": "url", "output_format": "mp4", "stream": False, "nvext": {}}[field]
        sync(**{field: value})  # accepted
    for field in VIDEO_NVEXT["properties"]:
        sync(nvext={field: "x" if field == "negative_prompt" else 1})


# ---- limits, defaults, and the agreement of seconds, fps and num_frames ------------------------------------

def spec(**kw) -> VideoSpec:
    return resolve(VideoParams(model="v", prompt="p", **kw), LIMITS)


def test_defaults_come_from_the_model():
    s = spec()
    assert (s.width, s.height, s.fps, s.num_frames, s.steps, s.output_format) == (256, 128, 8.0, 16, 4, "mp4")
    assert s.seconds == 2.0 and s.size == "256x128"
    assert spec().seed != spec().seed  # drawn when not given
    assert spec(seed=5).seed == 5


@pytest.mark.parametrize(("given", "fps", "frames"), [
    ({"seconds": 3.0}, 8.0, 24),
    ({"seconds": 3.0, "fps": 4.0}, 4.0, 12),
    ({"num_frames": 10}, 8.0, 10),
    ({"seconds": 2.0, "num_frames": 30}, 15.0, 30),
    ({"fps": 12.0, "num_frames": 36}, 12.0, 36),
    ({"seconds": 2.0, "fps": 12.0, "num_frames": 24}, 12.0, 24),
])
def test_timing_follows_from_what_was_given(given, fps, frames):
    s = spec(**given)
    assert (s.fps, s.num_frames) == (fps, frames)


def test_timing_that_disagrees_is_a_400_naming_them():
    msg = bad(lambda: spec(seconds=2.0, fps=12.0, num_frames=25), "nvext.num_frames")
    assert "seconds" in msg and "fps" in msg and "24" in msg


@pytest.mark.parametrize(("given", "param"), [
    ({"seconds": 7.0}, "seconds"),  # 56 frames > 48
    ({"num_frames": 49}, "nvext.num_frames"),
    ({"seconds": 0.01}, "seconds"),  # less than a frame
    ({"size": "1024x128"}, "size"),
    ({"size": "250x128"}, "size"),
    ({"size": "256*128"}, "size"),
    ({"steps": 21}, "nvext.num_inference_steps"),
])
def test_limits(given, param):
    bad(lambda: spec(**given), param)


def test_formats_and_input_image_against_the_model():
    no_mjpeg = MediaLimits(**{**LIMITS.__dict__, "output_formats": ("mp4",), "takes_image": False})
    bad(lambda: resolve(VideoParams(model="v", prompt="p", output_format="mjpeg"), no_mjpeg), "output_format")
    bad(lambda: resolve(VideoParams(model="v", prompt="p", input_image=PNG), no_mjpeg), "input_reference")


def test_spec_round_trips_through_a_job_record():
    s = spec(input_image=PNG, guidance_scale=3.0, seed=9)
    assert VideoSpec.from_record(orjson.loads(orjson.dumps(s.to_record()))) == s


# ---- the model check ---------------------------------------------------------------------------------------

def card(name: str, endpoints: tuple[str, ...], media: MediaLimits | None) -> list[WorkerCard]:
    return [WorkerCard("w", "127.0.0.1:1", ModelCard(name, "/m", endpoints=endpoints, media=media))]


def test_only_a_video_model_makes_videos():
    models = {"v": card("v", (VIDEOS,), LIMITS), "i": card("i", (IMAGES,), MediaLimits()),
              "t": card("t", (CHAT, COMPLETIONS), None)}
    check_video_model(models, "v")
    assert "/v1/images/generations" in bad(lambda: check_video_model(models, "i"), "model")
    assert "/v1/chat/completions" in bad(lambda: check_video_model(models, "t"), "model")
    no_limits = {"v": card("v", (VIDEOS,), None)}
    assert "limits" in bad(lambda: check_video_model(no_limits, "v"), "model")
    with pytest.raises(NotFound):
        check_video_model(models, "nope")


# ---- the synchronous answer, written in pieces -------------------------------------------------------------

@pytest.mark.parametrize("cuts", [[], [1], [2, 5], [3, 6, 9], [1000]])
def test_b64_pieces_join_into_one_encoding(cuts):
    data = bytes(range(256)) * 7
    stream, pieces, prev = Base64Stream(), [], 0
    for cut in [*cuts, len(data)]:
        pieces.append(stream.feed(data[prev:cut]))
        prev = cut
    pieces.append(stream.end())
    body = SyncBody("video_1", "v", 5, "mp4", 8.0)
    raw = body.head("b64_json") + b"".join(pieces) + body.tail(1.5, b64=True)
    answer = orjson.loads(raw)
    assert base64.b64decode(answer["data"][0]["b64_json"]) == data
    assert answer | {"data": None} == {"id": "video_1", "object": "video", "model": "v", "status": "completed",
                                       "progress": 100, "created": 5, "data": None, "inference_time_s": 1.5}
    assert answer["data"][0]["output_format"] == "mp4" and answer["data"][0]["fps"] == 8.0
