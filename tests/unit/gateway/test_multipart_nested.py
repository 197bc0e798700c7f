"""Nested fields in multipart forms: the bracketed names the openai SDK flattens ``extra_body`` into
(``nvext[fps]``, ``a[b][c]``, ``a[]``) read back as objects, their text read as the numbers and booleans a
field needs, and every malformed or conflicting name a 400 naming it (image edits and video creates)."""

from __future__ import annotations

import base64
import io

import httpx
import openai
import pytest
from openai._base_client import ForceMultipartDict
from PIL import Image

from services.common.errors import InvalidRequest
from services.gateway.core.fields import UINT32
from services.gateway.images.request import parse_edit
from services.gateway.media.multipart import FormFields, Part, field_path, parse_form, text_object
from services.gateway.videos.request import form_fields, parse_openai

pytestmark = pytest.mark.unit


def texts(*pairs: tuple[str, str]) -> list[Part]:
    return [Part(name=name, data=value.encode()) for name, value in pairs]


def sdk_form(body: dict, files: list | None = None) -> tuple[bytes, str]:
    """``body`` as the openai SDK puts it in a multipart request: its own flattening
    (``_serialize_multipartform``), then httpx's multipart encoding (multipart even without a file, as the
    SDK forces it)."""
    client = openai.OpenAI(api_key="unused", base_url="http://localhost:1/v1")
    request = httpx.Request("POST", "http://x", data=client._serialize_multipartform(body),
                            files=files or ForceMultipartDict())
    client.close()
    return request.read(), request.headers["content-type"]


def refused(fn, param: str) -> str:
    with pytest.raises(InvalidRequest) as e:
        fn()
    assert e.value.param == param, (e.value.param, e.value.message)
    return e.value.message


def png(size=(64, 48)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size).save(out, "PNG")
    return out.getvalue()


# ---- names and objects -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "path"), [
    ("model", (["model"], False)),
    ("nvext[fps]", (["nvext", "fps"], False)),
    ("a[b][c]", (["a", "b", "c"], False)),
    ("a[]", (["a"], True)),
    ("a[b][]", (["a", "b"], True)),
    ("image[]", (["image"], True)),
])
def test_field_path(name, path):
    assert field_path(name) == path


@pytest.mark.parametrize("name", ["nvext[", "a]b", "[x]", "a[b]c", "a[b", "a[[b]]", "a[][b]", "a[][]", "]"])
def test_a_malformed_name_is_a_400_naming_it(name):
    assert repr(name) in refused(lambda: field_path(name), name)


def test_the_sdks_flattening_reads_back_as_the_object_it_was():
    body = {"model": "m", "nvext": {"fps": 8, "num_frames": 9, "deep": {"x": 1.5}}, "tags": ["a", "b"],
            "flag": True}
    raw, ctype = sdk_form(body)
    form = parse_form(raw, ctype)
    assert {p.name for p in form.parts} == {"model", "nvext[fps]", "nvext[num_frames]", "nvext[deep][x]", "tags[]",
                                            "flag"}
    assert text_object(form.parts) == {"model": "m", "nvext": {"fps": "8", "num_frames": "9", "deep": {"x": "1.5"}},
                                       "tags": ["a", "b"], "flag": "true"}


@pytest.mark.parametrize(("pairs", "param"), [
    ((("nvext[fps]", "8"), ("nvext[fps]", "9")), "nvext.fps"),
    ((("nvext", "{}"), ("nvext[fps]", "8")), "nvext"),
    ((("nvext[fps]", "8"), ("nvext", "{}")), "nvext"),
    ((("a[]", "1"), ("a", "2")), "a"),
    ((("a", "1"), ("a[]", "2")), "a"),
    ((("a[b]", "1"), ("a[b][c]", "2")), "a.b"),
    ((("model", "m"), ("model", "m")), "model"),
])
def test_a_field_given_twice_is_a_400_naming_it(pairs, param):
    assert "more than once" in refused(lambda: text_object(texts(*pairs)), param)


def test_a_file_among_text_fields_is_a_400():
    refused(lambda: text_object([Part(name="nvext[seed]", data=b"1", filename="x.txt")]), "nvext[seed]")


# ---- text read as the type a field needs -------------------------------------------------------------------

def test_form_fields_read_numbers_and_booleans_from_text():
    f = FormFields({"n": "9", "x": "8.5", "big": "1e3", "whole": "4.0", "on": "true", "off": "false",
                    "nvext": {"seed": "7"}})
    assert f.int("n", UINT32) == 9 and f.float("x") == 8.5 and f.float("big") == 1000.0
    assert f.int("whole", UINT32) == 4 and f.bool("on") is True and f.bool("off") is False
    nested = f.nested("nvext")
    assert nested is not None and nested.int("seed", UINT32) == 7
    assert f.int("absent", UINT32) is None and f.bool("absent") is False


@pytest.mark.parametrize(("read", "param", "says"), [
    (lambda f: f.int("n", UINT32), "n", "must be an integer"),
    (lambda f: f.int("x", UINT32), "x", "must be an integer"),
    (lambda f: f.float("n"), "n", "must be a number"),
    (lambda f: f.float("inf"), "inf", "must be a number"),
    (lambda f: f.bool("n"), "n", "must be a boolean"),
    (lambda f: f.str("obj"), "obj", "must be a string"),
    (lambda f: f.nested("obj").int("k", UINT32), "obj.k", "must be an integer"),
])
def test_text_that_is_not_the_type_is_a_400_naming_the_field(read, param, says):
    f = FormFields({"n": "nine", "x": "8.5", "inf": "Infinity", "obj": {"k": "true"}})
    assert says in refused(lambda: read(f), param)


# ---- the endpoints -----------------------------------------------------------------------------------------

def test_a_video_create_takes_nvext_as_the_sdk_sends_it():
    raw, ctype = sdk_form({"model": "v", "prompt": "a cat", "seconds": "2",
                           "nvext": {"num_frames": 9, "fps": 8, "seed": 3, "guidance_scale": 4.5,
                                     "num_inference_steps": 2, "negative_prompt": "7"}})
    p = parse_openai(*form_fields(parse_form(raw, ctype)))
    assert (p.num_frames, p.fps, p.seed, p.guidance_scale, p.steps, p.negative_prompt) == (9, 8.0, 3, 4.5, 2, "7")
    assert p.seconds == 2.0


def test_a_video_create_takes_input_reference_as_a_nested_image_url():
    url = "data:image/png;base64," + base64.b64encode(png()).decode()
    raw, ctype = sdk_form({"model": "v", "prompt": "a cat", "input_reference": {"image_url": url}})
    assert parse_openai(*form_fields(parse_form(raw, ctype))).input_image == png()


@pytest.mark.parametrize(("nvext", "param"), [
    ({"bogus": 1}, "nvext.bogus"),
    ({"fps": {"x": 1}}, "nvext.fps"),
    ({"num_frames": "nine"}, "nvext.num_frames"),
    ({"num_frames": 1.5}, "nvext.num_frames"),
    ({"seed": -1}, "nvext.seed"),
])
def test_a_bad_nested_video_field_is_a_400_naming_it(nvext, param):
    raw, ctype = sdk_form({"model": "v", "prompt": "a cat", "nvext": nvext})
    refused(lambda: parse_openai(*form_fields(parse_form(raw, ctype))), param)


def test_an_image_edit_takes_nvext_as_the_sdk_sends_it():
    raw, ctype = sdk_form({"model": "m", "prompt": "a hat", "n": 2, "stream": True,
                           "nvext": {"seed": 5, "num_inference_steps": 3, "guidance_scale": 2.5}},
                          files=[("image", ("a.png", png(), "image/png"))])
    req = parse_edit(raw, ctype)
    assert (req.seed, req.steps, req.guidance_scale, req.n, req.stream) == (5, 3, 2.5, 2, True)


@pytest.mark.parametrize(("fields", "param"), [
    ({"nvext": {"bogus": 1}}, "nvext.bogus"),
    ({"nvext": {"seed": "five"}}, "nvext.seed"),
    ({"size": {"w": 1}}, "size"),
])
def test_a_bad_nested_edit_field_is_a_400_naming_it(fields, param):
    raw, ctype = sdk_form({"model": "m", "prompt": "a hat", **fields}, files=[("image", ("a.png", png(), "image/png"))])
    refused(lambda: parse_edit(raw, ctype), param)


@pytest.mark.parametrize("name", ["nvext[", "a]b", "nvext[][seed]"])
def test_a_malformed_name_at_either_endpoint_is_a_400(name):
    raw, ctype = sdk_form({"model": "m", "prompt": "p", name: "1"}, files=[("image", ("a.png", png(), "image/png"))])
    refused(lambda: parse_edit(raw, ctype), name)
    refused(lambda: form_fields(parse_form(raw, ctype)), name)


def test_nvext_as_json_text_and_as_fields_at_once_is_a_400():
    raw, ctype = sdk_form({"model": "m", "prompt": "a hat", "nvext": {"seed": 1}},
                          files=[("image", ("a.png", png(), "image/png")), ("nvext", (None, '{"seed": 2}'))])
    refused(lambda: parse_edit(raw, ctype), "nvext")
