"""KServe requests for media models -> the worker's GenerateMediaRequest, checked against the model's limits;
and the metadata a media model announces."""

from __future__ import annotations

import pytest
from meshfront.worker.v1 import media_pb2

from services.common.discovery import IMAGES, VIDEOS, MediaLimits, ModelCard
from services.common.errors import InvalidRequest
from services.gateway.kserve import metadata, protocol
from services.gateway.kserve.media import parse_media
from services.gateway.kserve.request import parameter_values

pytestmark = pytest.mark.unit

IMAGE = ModelCard("img", "", endpoints=(IMAGES,), media=MediaLimits(
    max_width=512, max_height=512, default_width=256, default_height=256, max_n=4, default_steps=3, max_steps=10,
    output_formats=("png", "jpeg"), takes_image=False))
VIDEO = ModelCard("vid", "", endpoints=(VIDEOS,), media=MediaLimits(
    max_width=256, max_height=256, default_width=64, default_height=48, size_multiple=16, max_n=1, default_steps=2,
    max_steps=10, output_formats=("mp4", "mjpeg"), default_fps=8.0, max_frames=32, default_frames=8,
    takes_image=True))


def infer(card: ModelCard, inputs: dict[str, bytes], params: dict | None = None, outputs=()):
    req = protocol.ModelInferRequest(model_name=card.name, id="c")
    for name, value in inputs.items():
        req.inputs.add(name=name, datatype="BYTES", shape=[1]).contents.bytes_contents.append(value)
    for key, value in (params or {}).items():
        kind = {int: "int64_param", float: "double_param", str: "string_param"}[type(value)]
        setattr(req.parameters[key], kind, value)
    for name in outputs:
        req.outputs.add(name=name)
    return parse_media(req, card, parameter_values(req.parameters), "rid")


def refused(param: str, *args, **kw) -> str:
    with pytest.raises(InvalidRequest) as e:
        infer(*args, **kw)
    assert e.value.param == param, (e.value.param, e.value.message)
    return e.value.message


def test_an_image_request_with_defaults_and_parameters():
    r = infer(IMAGE, {"prompt": b"a fox"})
    assert (r.kind, r.prompt, r.width, r.height, r.n, r.num_inference_steps, r.output_format) == (
        media_pb2.MEDIA_KIND_IMAGE, "a fox", 256, 256, 1, 3, "png")
    r = infer(IMAGE, {"prompt": b"x", "negative_prompt": b"blur"},
              {"size": "128x64", "n": 3, "steps": 5, "seed": 7, "guidance_scale": 4.5, "output_format": "jpeg"},
              outputs=("output",))
    assert (r.width, r.height, r.n, r.num_inference_steps, r.seed, r.output_format, r.negative_prompt) == (
        128, 64, 3, 5, 7, "jpeg", "blur")
    assert r.HasField("guidance_scale") and r.guidance_scale == 4.5


def test_a_video_request_follows_the_video_rules():
    r = infer(VIDEO, {"prompt": b"x", "input_image": b"\x89PNG..."}, {"seconds": 2.0, "fps": 4.0})
    assert (r.kind, r.num_frames, r.fps, r.width, r.height, r.output_format, r.n) == (
        media_pb2.MEDIA_KIND_VIDEO, 8, 4.0, 64, 48, "mp4", 1)
    assert r.input_image == b"\x89PNG..."
    message = refused("num_frames", VIDEO, {"prompt": b"x"}, {"seconds": 2.0, "fps": 4.0, "num_frames": 9})
    assert "disagree" in message and "'num_frames'" in message and "nvext" not in message


@pytest.mark.parametrize(("card", "inputs", "params", "outputs", "param"), [
    (IMAGE, {"prompt": b"x"}, {"n": 5}, (), "n"),
    (IMAGE, {"prompt": b"x"}, {"steps": 11}, (), "steps"),
    (IMAGE, {"prompt": b"x"}, {"output_format": "webp"}, (), "output_format"),
    (IMAGE, {"prompt": b"x"}, {"size": "1024x1024"}, (), "size"),
    (IMAGE, {"prompt": b"x"}, {"fps": 2.0}, (), "fps"),  # a video parameter on an image model
    (IMAGE, {"prompt": b"x", "input_image": b"img"}, {}, (), "input_image"),
    (IMAGE, {"text_input": b"x"}, {}, (), "text_input"),
    (IMAGE, {}, {}, (), "prompt"),
    (IMAGE, {"prompt": b"x"}, {}, ("text_output",), "text_output"),
    (VIDEO, {"prompt": b"x"}, {"n": 2}, (), "n"),
    (VIDEO, {"prompt": b"x"}, {"num_frames": 33}, (), "num_frames"),
    (VIDEO, {"prompt": b"x"}, {"steps": 11}, (), "steps"),
    (VIDEO, {"prompt": b"x"}, {"seed": -1}, (), "seed"),
])
def test_refused(card, inputs, params, outputs, param):
    refused(param, card, inputs, params, outputs=outputs)


def test_metadata_and_config_of_a_media_model():
    meta = metadata.model_metadata("vid", is_media=True)
    assert [(t.name, t.datatype) for t in meta.inputs] == [("prompt", "BYTES"), ("negative_prompt", "BYTES"),
                                                           ("input_image", "BYTES")]
    assert [(t.name, list(t.shape)) for t in meta.outputs] == [("output", [-1])]
    cfg = metadata.model_config("vid", is_media=True).config
    assert not cfg.model_transaction_policy.decoupled
    assert {t.name: t.optional for t in cfg.input} == {"prompt": False, "negative_prompt": True, "input_image": True}
    assert metadata.model_config("text").config.model_transaction_policy.decoupled  # text models unchanged
