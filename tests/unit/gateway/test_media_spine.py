"""The media spine's pure parts: multipart/form-data parsing (as the openai SDK and httpx send it, and
malformed), media URLs, and the gateway's media flags."""

import httpx
import pytest

from services.common.errors import InvalidRequest
from services.gateway import config as gateway_config
from services.gateway.media.multipart import parse_form
from services.gateway.media.store import media_url

pytestmark = pytest.mark.unit

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4 + b"\r\n--not-the-boundary\r\n"


def encoded(files, data) -> tuple[bytes, str]:
    req = httpx.Request("POST", "http://x", files=files, data=data)
    return req.read(), req.headers["content-type"]


def test_files_and_fields_come_back_byte_for_byte():
    body, ct = encoded([("image[]", ("a.png", PNG, "image/png")), ("image[]", ("b.png", b"", "image/png")),
                        ("mask", ("m.png", PNG[:10], "image/png"))], {"prompt": "héllo", "n": "2"})
    form = parse_form(body, ct)
    assert form.text("prompt") == "héllo" and form.text("n") == "2" and form.text("size") is None
    images = form.all("image", "image[]")
    assert [(p.filename, p.data, p.content_type) for p in images] == [("a.png", PNG, "image/png"),
                                                                      ("b.png", b"", "image/png")]
    assert form.all("mask")[0].data == PNG[:10]
    assert form.names() == {"image[]", "mask", "prompt", "n"}


def test_a_text_field_must_not_be_a_file_or_repeat():
    body, ct = encoded([("prompt", ("p.txt", b"x", "text/plain"))], {"n": ["1", "2"]})
    form = parse_form(body, ct)
    with pytest.raises(InvalidRequest, match="text field") as e:
        form.text("prompt")
    assert e.value.param == "prompt"
    with pytest.raises(InvalidRequest, match="2 times"):
        form.text("n")


@pytest.mark.parametrize(("body", "ct", "match"), [
    (b"{}", "application/json", "multipart/form-data"),
    (b"", "multipart/form-data", "boundary"),
    (b"nothing here", "multipart/form-data; boundary=xyz", "no part"),
    (b"--xyz\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nvalue", "multipart/form-data; boundary=xyz",
     "closing boundary"),
    (b"--xyz\r\nContent-Type: text/plain\r\n\r\nv\r\n--xyz--", "multipart/form-data; boundary=xyz", "form-data"),
    (b"--xyz\r\nContent-Disposition: form-data\r\n\r\nv\r\n--xyz--", "multipart/form-data; boundary=xyz",
     "field name"),
    (b"--xyzjunk", "multipart/form-data; boundary=xyz", "malformed"),
])
def test_malformed_bodies_are_400s(body, ct, match):
    with pytest.raises(InvalidRequest, match=match):
        parse_form(body, ct)


def test_part_count_is_bounded():
    body, ct = encoded([("f0", ("f.png", b"x", "image/png"))], {f"f{i}": "x" for i in range(1, 5)})
    assert len(parse_form(body, ct, max_parts=5).parts) == 5
    with pytest.raises(InvalidRequest, match="more than 4 parts"):
        parse_form(body, ct, max_parts=4)


def test_media_urls_use_the_public_url_else_the_request_host():
    assert media_url("abc", "https://api.example.com/ai", {"x-forwarded-host": "h"}) == \
        "https://api.example.com/ai/v1/media/abc"
    assert media_url("abc", "", {"x-forwarded-proto": "https", "x-forwarded-host": "edge:8000"}) == \
        "https://edge:8000/v1/media/abc"


def test_media_flags():
    cfg = gateway_config.parse_config([], env={})
    assert (cfg.media_url_ttl_s, cfg.public_url) == (3600, "")
    cfg = gateway_config.parse_config(["--media-url-ttl-s", "5", "--public-url", "https://a.example"], env={})
    assert (cfg.media_url_ttl_s, cfg.public_url) == (5, "https://a.example")
    for argv in (["--media-url-ttl-s", "0"], ["--media-url-ttl-s", str(8 * 24 * 3600)],
                 ["--public-url", "ftp://x"], ["--public-url", "https://x/"], ["--public-url", "x.example"]):
        with pytest.raises((SystemExit, ValueError)):
            gateway_config.parse_config(argv, env={})
