"""The Images API's pure parts: parsing and validation (JSON and multipart), the checks against a model's
limits, the answers written from worker events, and the model-kind check."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import os

import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from meshfront.worker.v1 import media_pb2
from PIL import Image

from services.common.discovery import IMAGES, VIDEOS, MediaLimits, ModelCard, WorkerCard
from services.common.errors import InvalidRequest, NotFound, WorkerFailed
from services.gateway.front_door import check_model
from services.gateway.images.render import ImagesAnswer
from services.gateway.images.request import parse_edit, parse_generation, resolve
from services.gateway.media.base64_stream import Base64Stream

pytestmark = pytest.mark.unit

LIMITS = MediaLimits(max_width=512, max_height=256, default_width=256, default_height=128, max_n=4,
                     default_steps=10, max_steps=50, output_formats=("png", "webp"), takes_image=True)


def gen(**body) -> bytes:
    return orjson.dumps({"model": "m", "prompt": "a cat", **body})


def png(size=(64, 48)) -> bytes:
    out = io.BytesIO()
    Image.new("RGBA", size).save(out, "PNG")
    return out.getvalue()


def test_defaults_and_every_field():
    req = parse_generation(gen())
    assert (req.n, req.size, req.response_format, req.output_format, req.quality, req.background, req.stream) == \
        (1, None, "b64_json", "png", "auto", "auto", False)
    job = resolve(req, LIMITS, "rid")
    assert (job.width, job.height, job.num_inference_steps, job.n) == (256, 128, 10, 1)
    assert not job.HasField("guidance_scale") and not job.HasField("output_compression")
    req = parse_generation(gen(n=2, size="64x32", response_format="url", output_format="webp", output_compression=70,
                               quality="high", background="transparent", user="u", safety_identifier="s",
                               moderation="low", nvext={"negative_prompt": "blur", "num_inference_steps": 5,
                                                        "guidance_scale": 3.5, "seed": 9}))
    job = resolve(req, LIMITS, "rid")
    assert (job.width, job.height, job.n, job.seed, job.num_inference_steps, job.negative_prompt) == \
        (64, 32, 2, 9, 5, "blur")
    assert (job.output_format, job.output_compression, job.quality, job.background, job.guidance_scale) == \
        ("webp", 70, "high", "transparent", 3.5)


def test_a_seed_is_drawn_when_none_is_given():
    seeds = {resolve(parse_generation(gen()), LIMITS, "r").seed for _ in range(5)}
    assert len(seeds) > 1


@pytest.mark.parametrize(("body", "param"), [
    ({"size": "64"}, "size"), ({"size": "0x64"}, "size"), ({"size": 64}, "size"),
    ({"n": 0}, "n"), ({"n": 11}, "n"), ({"n": 1.5}, "n"), ({"n": "2"}, "n"),
    ({"response_format": "png"}, "response_format"), ({"output_format": "gif"}, "output_format"),
    ({"output_compression": 101, "output_format": "webp"}, "output_compression"),
    ({"output_compression": 50}, "output_compression"),  # png has no compression level
    ({"background": "transparent", "output_format": "jpeg"}, "background"),
    ({"quality": "ultra"}, "quality"), ({"stream": "yes"}, "stream"),
    ({"stream": True, "partial_images": 4}, "partial_images"), ({"partial_images": 1}, "partial_images"),
    ({"stream": True, "response_format": "url"}, "response_format"),
    ({"nvext": {"num_inference_steps": 0}}, "nvext.num_inference_steps"),
    ({"nvext": {"guidance_scale": -1}}, "nvext.guidance_scale"),
    ({"nvext": {"seed": -1}}, "nvext.seed"), ({"nvext": {"fps": 3}}, "nvext.fps"), ({"nvext": 3}, "nvext"),
    ({"style": "vivid"}, "style"), ({"prompt": ""}, "prompt"), ({"prompt": "x" * 32001}, "prompt"),
    ({"model": None}, "model"),
    ({"input_reference": "https://example.com/a.png"}, "input_reference"),
    ({"input_reference": "not base64!"}, "input_reference"),
    ({"input_reference": base64.b64encode(b"GIF89a....").decode()}, "input_reference"),
])
def test_bad_fields_are_400s_naming_them(body, param):
    with pytest.raises(InvalidRequest) as e:
        parse_generation(gen(**body))
    assert e.value.param == param, e.value.message


@pytest.mark.parametrize(("body", "param"), [
    ({"size": "520x64"}, "size"), ({"size": "64x260"}, "size"), ({"size": "60x64"}, "size"), ({"size": "8x4"}, "size"),
    ({"n": 5}, "n"), ({"nvext": {"num_inference_steps": 51}}, "nvext.num_inference_steps"),
    ({"output_format": "jpeg"}, "output_format"), ({"nvext": {"seed": 2**64 - 1}, "n": 2}, "nvext.seed"),
])
def test_the_models_limits_are_400s_naming_the_parameter(body, param):
    with pytest.raises(InvalidRequest) as e:
        resolve(parse_generation(gen(**body)), LIMITS, "r")
    assert e.value.param == param, e.value.message


def test_input_reference_is_an_image_the_model_must_take():
    data_url = "data:image/png;base64," + base64.b64encode(png()).decode()
    req = parse_generation(gen(input_reference=data_url))
    assert req.input_image == png() and req.input_size == (64, 48)
    assert (resolve(req, LIMITS, "r").width, resolve(req, LIMITS, "r").height) == (64, 48)  # auto: the input's
    with pytest.raises(InvalidRequest) as e:
        resolve(req, MediaLimits(), "r")
    assert e.value.param == "input_reference"


def multipart(files, **data) -> tuple[bytes, str]:
    r = httpx.Request("POST", "http://x", files=files, data={"model": "m", "prompt": "a hat", **data})
    return r.read(), r.headers["content-type"]


def test_edits_read_multipart_as_the_sdk_sends_it():
    body, ct = multipart([("image", ("a.png", png(), "image/png")), ("mask", ("m.png", png(), "image/png"))],
                         n="2", size="64x32", stream="true", partial_images="1", nvext='{"seed": 4}')
    req = parse_edit(body, ct)
    assert (req.n, req.size, req.stream, req.partial_images, req.seed, req.edit) == (2, (64, 32), True, 1, 4, True)
    assert req.input_image == png() and req.mask == png()
    body, ct = multipart([("image[]", ("a.png", png((80, 40)), "image/png"))])
    job = resolve(parse_edit(body, ct), LIMITS, "r")
    assert (job.width, job.height) == (80, 40)
    body, ct = multipart([("image", ("a.png", png((1030, 300)), "image/png"))])
    job = resolve(parse_edit(body, ct), LIMITS, "r")  # past 512x256: scaled to fit, aspect kept, multiples of 8
    assert (job.width, job.height) == (512, 144)


@pytest.mark.parametrize(("files", "data", "param"), [
    ([], {}, "image"),
    ([("image[]", ("a.png", png(), "image/png")), ("image[]", ("b.png", png(), "image/png"))], {}, "image"),
    ([("image", ("a.png", b"not an image", "image/png"))], {}, "image"),
    ([("image", ("a.png", png(), "image/png")), ("mask", ("m.png", png((8, 8)), "image/png"))], {}, "mask"),
    ([("image", ("a.png", png(), "image/png"))], {"n": "two"}, "n"),
    ([("image", ("a.png", png(), "image/png"))], {"stream": "maybe"}, "stream"),
    ([("image", ("a.png", png(), "image/png"))], {"nvext": "{"}, "nvext"),
    ([("image", ("a.png", png(), "image/png"))], {"input_fidelity": "high"}, "input_fidelity"),
])
def test_bad_edits_are_400s_naming_the_parameter(files, data, param):
    body, ct = multipart(files or [("mask", ("m.png", png(), "image/png"))], **data)
    with pytest.raises(InvalidRequest) as e:
        parse_edit(body, ct)
    assert e.value.param == param, e.value.message


def test_base64_written_chunk_by_chunk_is_the_whole_encoding():
    data = os.urandom(10_001)
    for step in (1, 2, 3, 7, 1000, 4096):
        w = Base64Stream()
        out = b"".join(w.feed(data[i:i + step]) for i in range(0, len(data), step)) + w.end()
        assert out == base64.b64encode(data)


def events(*outputs: bytes, chunk: int = 5, partials: int = 0) -> list[media_pb2.GenerateMediaResponse]:
    out = [media_pb2.GenerateMediaResponse(partial=media_pb2.MediaPartial(index=0, partial_index=i, data=b"p"))
           for i in range(partials)]
    for index, data in enumerate(outputs):
        pieces = [data[i:i + chunk] for i in range(0, len(data), chunk)]
        out += [media_pb2.GenerateMediaResponse(chunk=media_pb2.MediaChunk(index=index, data=p,
                                                                           last=i == len(pieces) - 1))
                for i, p in enumerate(pieces)]
    done = media_pb2.MediaDone(content_type="image/png", input_tokens=3, output_tokens=64)
    return [*out, media_pb2.GenerateMediaResponse(done=done)]


async def aiter_of(items):
    for item in items:
        yield item


def run(gen_) -> list[bytes]:
    async def go():
        return [piece async for piece in gen_]
    return asyncio.run(go())


def answer(n: int, stream: bool = False, edit: bool = False) -> ImagesAnswer:
    body = {"n": n, "stream": stream, **({"partial_images": 1} if stream else {})}
    return ImagesAnswer(parse_generation(gen(**body)), 64, 32, edit=edit)


def test_the_b64_body_is_written_in_pieces_and_parses_whole():
    a, b = os.urandom(23), os.urandom(9)
    pieces = run(answer(2).b64_body(aiter_of(events(a, b))))
    assert len(pieces) > 3
    body = orjson.loads(b"".join(pieces))
    assert [base64.b64decode(d["b64_json"]) for d in body["data"]] == [a, b]
    assert body["size"] == "64x32" and body["usage"]["input_tokens"] == 3 and body["usage"]["total_tokens"] == 67


def test_outputs_missing_or_out_of_order_are_worker_failures():
    with pytest.raises(WorkerFailed):
        run(answer(2).b64_body(aiter_of(events(b"abc"))))
    swapped = events(b"abc", b"def")
    swapped[0].chunk.index = 1
    with pytest.raises(WorkerFailed):
        run(answer(2).b64_body(aiter_of(swapped)))


def test_streamed_events_carry_partials_then_each_image():
    frames = run(answer(2, stream=True, edit=True).sse(aiter_of(events(b"one", b"two", partials=1))))
    parsed = [(f.split(b"\n")[0], orjson.loads(f.split(b"\n")[1][len(b"data: "):])) for f in frames]
    assert [name for name, _ in parsed] == [b"event: image_edit.partial_image", b"event: image_edit.completed",
                                           b"event: image_edit.completed"]
    assert [base64.b64decode(e["b64_json"]) for _, e in parsed] == [b"p", b"one", b"two"]
    assert parsed[0][1]["partial_image_index"] == 0 and parsed[2][1]["usage"]["output_tokens"] == 64


def test_url_body_stores_each_output():
    stored: list[tuple[bytes, str]] = []

    async def store(chunks, content_type):
        stored.append((b"".join([c async for c in chunks]), content_type))
        return f"http://edge/v1/media/{len(stored)}"

    body = orjson.loads(b"".join(run(answer(2).url_body(aiter_of(events(b"a" * 12, b"b" * 3)), store))))
    assert stored == [(b"a" * 12, "image/png"), (b"b" * 3, "image/png")]
    assert [d["url"] for d in body["data"]] == ["http://edge/v1/media/1", "http://edge/v1/media/2"]


def card(name: str, endpoints: tuple[str, ...]) -> list[WorkerCard]:
    return [WorkerCard("w", "h:1", ModelCard(name, "/d", endpoints=endpoints,
                                              media=MediaLimits() if endpoints[0] in (IMAGES, VIDEOS) else None))]


def test_check_model_tells_media_kinds_apart():
    models = {"img": card("img", (IMAGES,)), "vid": card("vid", (VIDEOS,)), "chat": card("chat", ("chat",)),
              "emb": card("emb", ("embeddings",))}
    check_model(models, "img", media=IMAGES)
    check_model(models, "vid", media=VIDEOS)
    check_model(models, "chat")
    for name, kw, text in [("chat", {"media": IMAGES}, "`chat` is not an image model; use /v1/chat/completions"),
                           ("emb", {"media": IMAGES}, "not an image model; use /v1/embeddings"),
                           ("vid", {"media": IMAGES}, "not an image model; use /v1/videos"),
                           ("img", {"media": VIDEOS}, "not a video model; use /v1/images"),
                           ("img", {}, "`img` is an image model; use /v1/images/generations"),
                           ("vid", {}, "`vid` is a video model; use /v1/videos"),
                           ("img", {"embedding": True}, "`img` is an image model; use /v1/images")]:
        with pytest.raises(InvalidRequest, match=text) as e:
            check_model(models, name, **kw)
        assert e.value.param == "model"
    with pytest.raises(NotFound):
        check_model(models, "nope", media=IMAGES)


_FIELDS = ("model", "prompt", "n", "size", "response_format", "output_format", "output_compression", "quality",
           "background", "stream", "partial_images", "user", "moderation", "nvext", "input_reference", "seed")
_SCALARS = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False)
            | st.sampled_from(["png", "jpeg", "64x64", "auto", "url", "high", "transparent", "a cat", ""]) | st.text())
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.sampled_from(["seed", "num_inference_steps", "guidance_scale",
                                                          "negative_prompt", "x"]), inner, max_size=3), max_leaves=6)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(_FIELDS), _VALUES, max_size=8))
def test_any_json_body_is_a_request_or_a_400(body):
    try:
        resolve(parse_generation(orjson.dumps({"model": "m", "prompt": "p", **body})), LIMITS, "r")
    except InvalidRequest as e:
        assert e.param or e.message


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.sampled_from(["multipart/form-data; boundary=xyz", "multipart/form-data",
                                                 "text/plain", ""]))
def test_any_multipart_body_is_an_edit_or_a_400(raw, content_type):
    body = b"--xyz\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\n" + raw + b"\r\n--xyz--"
    for candidate in (raw, body):
        with contextlib.suppress(InvalidRequest):
            parse_edit(candidate, content_type)
