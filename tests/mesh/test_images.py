"""The Images API through Envoy with the unmodified openai SDK, against the mocker's image simulator
(`meshfront mocker --media image`) beside a text model, with two gateway replicas and a short URL TTL."""

from __future__ import annotations

import base64
import hashlib
import io
import random
import time

import grpc
import httpx
import openai
import pytest
from meshfront.gateway.v1 import media_pb2, media_pb2_grpc
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import sdk_client, stop_cleanly
from tests.mesh.conftest import DEMO, mocker, start_mesh

pytestmark = [pytest.mark.mesh, pytest.mark.timeout(300)]

IMAGE = "meshfront/demo-image"
NOISE = "meshfront/noise-image"  # incompressible outputs: a 4096x4096 PNG is ~50 MB
SLOW = "meshfront/slow-image"  # 50 ms steps, one job at a time and none waiting: busy is a 503
URL_TTL_S = 4


@pytest.fixture(scope="module")
def mesh(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    m = start_mesh(tmp_path_factory, [
        mocker(demo_model_dir, DEMO),
        mocker(demo_model_dir, IMAGE, "10", "--media", "image"),
        mocker(demo_model_dir, NOISE, "0", "--media", "image", "--media-noise",
               "--media-max-size", "4096x4096", "--media-default-steps", "1"),
        mocker(demo_model_dir, SLOW, "1", "--media", "image", "--media-step-ms", "50", "--max-running-jobs", "1",
               "--max-waiting-jobs", "0"),
    ], gateways=2, service_args={"gateway": ("--media-url-ttl-s", str(URL_TTL_S))})
    yield m
    stop_cleanly(m)


@pytest.fixture
def client(mesh):
    c = sdk_client(mesh, timeout=120)
    yield c
    c.close()


def decoded(b64: str) -> Image.Image:
    img = Image.open(io.BytesIO(base64.b64decode(b64)))
    img.load()
    return img


@pytest.mark.parametrize("size", ["64x64", "256x128", "120x200"])
def test_b64_json_decodes_to_exactly_the_requested_size(client, size):
    resp = client.images.generate(model=IMAGE, prompt="a red fox", size=size, response_format="b64_json")
    [image] = resp.data
    img = decoded(image.b64_json)
    assert f"{img.width}x{img.height}" == size and img.format == "PNG"
    assert resp.size == size and resp.output_format == "png" and resp.created > 0
    assert resp.usage.input_tokens == 3 and resp.usage.total_tokens >= resp.usage.input_tokens


def test_n_images_differ_and_seeds_decide_the_bytes(client):
    def images(seed: int, n: int) -> list[bytes]:
        resp = client.images.generate(model=IMAGE, prompt="a lighthouse", size="64x64", n=n,
                                      extra_body={"nvext": {"seed": seed, "num_inference_steps": 2}})
        return [base64.b64decode(d.b64_json) for d in resp.data]

    three = images(7, 3)
    assert len(three) == 3 and len(set(three)) == 3
    assert images(7, 1) == three[:1]  # output i is seed + i: the same seed, the same bytes
    assert images(8, 1) == three[1:2]
    assert images(1234, 1) != three[:1]


@pytest.mark.parametrize(("fmt", "pillow"), [("jpeg", "JPEG"), ("webp", "WEBP")])
def test_jpeg_and_webp(client, fmt, pillow):
    resp = client.images.generate(model=IMAGE, prompt="a boat", size="96x64", output_format=fmt,
                                  output_compression=80)
    img = decoded(resp.data[0].b64_json)
    assert img.format == pillow and img.size == (96, 64) and resp.output_format == fmt


def get_media(port: int, media_id: str) -> tuple[str, bytes]:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = media_pb2_grpc.MediaFilesServiceStub(channel)
        parts = list(stub.GetMedia(media_pb2.GetMediaRequest(media_id=media_id), timeout=30))
    return parts[0].content_type, b"".join(p.data for p in parts)


def test_a_url_is_served_by_every_replica_until_its_ttl(client, mesh):
    resp = client.images.generate(model=IMAGE, prompt="a kite", size="64x64", n=2, response_format="url",
                                  extra_body={"nvext": {"seed": 3}})
    urls = [d.url for d in resp.data]
    assert len(set(urls)) == 2 and all(u.startswith(f"{mesh.url}/v1/media/") for u in urls)
    same = client.images.generate(model=IMAGE, prompt="a kite", size="64x64", n=2,
                                  extra_body={"nvext": {"seed": 3}})
    fetched = httpx.get(urls[0], timeout=30)
    assert fetched.status_code == 200 and fetched.headers["content-type"] == "image/png"
    assert fetched.content == base64.b64decode(same.data[0].b64_json)
    media_id = urls[1].rsplit("/", 1)[1]
    for port in mesh.plan.gateway_ports:  # each replica, whichever one stored it
        assert get_media(port, media_id) == ("image/png", base64.b64decode(same.data[1].b64_json))
    time.sleep(URL_TTL_S + 0.5)
    gone = httpx.get(urls[0], timeout=30)
    assert gone.status_code == 404 and gone.json()["error"]["type"] == "not_found_error"
    assert httpx.get(f"{mesh.url}/v1/media/{'x' * 43}", timeout=30).status_code == 404


def test_streamed_partial_images(client):
    events = list(client.images.generate(model=IMAGE, prompt="a tree", size="64x64", stream=True,
                                         partial_images=2, extra_body={"nvext": {"num_inference_steps": 4}}))
    kinds = [e.type for e in events]
    assert kinds == ["image_generation.partial_image"] * 2 + ["image_generation.completed"]
    assert [e.partial_image_index for e in events[:2]] == [0, 1]
    assert all(decoded(e.b64_json).size == (64, 64) for e in events)
    assert events[-1].usage.input_tokens == 2 and events[-1].size == "64x64"


def png(size=(64, 64), color=(200, 30, 30, 255)) -> bytes:
    out = io.BytesIO()
    Image.new("RGBA", size, color).save(out, "PNG")
    return out.getvalue()


def test_images_edit_with_a_png_upload(client):
    resp = client.images.edit(model=IMAGE, image=("in.png", png(), "image/png"), prompt="add a hat",
                              mask=("mask.png", png(color=(0, 0, 0, 0)), "image/png"), n=2, size="64x64",
                              response_format="b64_json")
    assert len(resp.data) == 2 and all(decoded(d.b64_json).size == (64, 64) for d in resp.data)
    auto = client.images.edit(model=IMAGE, image=[("in.png", png((80, 48)), "image/png")], prompt="a hat")
    assert decoded(auto.data[0].b64_json).size == (80, 48)  # size auto: the input's
    events = list(client.images.edit(model=IMAGE, image=("in.png", png(), "image/png"), prompt="a hat",
                                     stream=True, partial_images=1))
    assert [e.type for e in events] == ["image_edit.partial_image", "image_edit.completed"]


def test_images_edit_with_nvext_through_extra_body(client):
    """The SDK sends extra_body's nvext in a multipart edit as nvext[seed], nvext[num_inference_steps]: the
    seed decides the bytes, as it does for a JSON generation."""
    def edit(seed: int) -> bytes:
        resp = client.images.edit(model=IMAGE, image=("in.png", png(), "image/png"), prompt="a hat", size="64x64",
                                  extra_body={"nvext": {"seed": seed, "num_inference_steps": 2}})
        return base64.b64decode(resp.data[0].b64_json)

    assert edit(11) == edit(11) != edit(12)
    with pytest.raises(openai.BadRequestError) as e:
        client.images.edit(model=IMAGE, image=("in.png", png(), "image/png"), prompt="a hat",
                           extra_body={"nvext": {"seed": 1, "bogus": 2}})
    assert e.value.status_code == 400 and e.value.body["param"] == "nvext.bogus", e.value.body
    with pytest.raises(openai.BadRequestError) as e:
        client.images.edit(model=IMAGE, image=("in.png", png(), "image/png"), prompt="a hat",
                           extra_body={"nvext": {"num_inference_steps": 101}})
    assert e.value.body["param"] == "nvext.num_inference_steps" and "at most" in e.value.message, e.value.body


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"size": "65x64"}, "size"),
    ({"size": "4096x4096"}, "size"),
    ({"size": "big"}, "size"),
    ({"n": 11}, "n"),
    ({"n": 0}, "n"),
    ({"output_format": "gif"}, "output_format"),
    ({"response_format": "base64"}, "response_format"),
    ({"extra_body": {"nvext": {"num_inference_steps": 101}}}, "nvext.num_inference_steps"),
    ({"extra_body": {"nvext": {"steps": 3}}}, "nvext.steps"),
    ({"extra_body": {"colour": "red"}}, "colour"),
    ({"partial_images": 4, "stream": True}, "partial_images"),
])
def test_bad_inputs_are_400s_naming_the_parameter(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.images.generate(model=IMAGE, prompt="x", **kwargs)
    assert e.value.status_code == 400 and e.value.body["param"] == param, e.value.body


def test_models_of_the_wrong_kind_are_400s(client):
    with pytest.raises(openai.BadRequestError, match="is not an image model"):
        client.images.generate(model=DEMO, prompt="a cat")
    with pytest.raises(openai.BadRequestError, match="is an image model; use /v1/images"):
        client.chat.completions.create(model=IMAGE, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.NotFoundError):
        client.images.generate(model="nope", prompt="a cat")
    kinds = {m.id: getattr(m, "kind", None) for m in client.models.list()}
    assert kinds[IMAGE] == "images" and kinds[DEMO] is None


def envoy_allocated(mesh) -> int:
    """Bytes Envoy's allocator holds now (its admin /memory)."""
    return int(httpx.get(f"http://127.0.0.1:{mesh.plan.admin_port}/memory", timeout=5).json()["allocated"])


def test_a_50_mb_result_passes_through_envoy_intact(client, mesh):
    resp = client.images.generate(model=NOISE, prompt="static", size="4096x4096", response_format="url",
                                  extra_body={"nvext": {"seed": 11}})
    before = envoy_allocated(mesh)
    with httpx.stream("GET", resp.data[0].url, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "image/png"
        pieces = r.iter_raw(65536)
        head = next(pieces)
        time.sleep(1)  # a slow reader: the gateway waits on Envoy, which holds a window's worth, not the image
        assert envoy_allocated(mesh) - before < 8_000_000
        raw = head + b"".join(pieces)
    assert len(raw) > 45_000_000, len(raw)
    img = Image.open(io.BytesIO(raw))
    img.load()  # every PNG chunk's CRC checked: the bytes arrived intact
    assert img.size == (4096, 4096)
    # The same image as b64_json: one JSON body of ~67 MB, written in pieces, byte for byte the same.
    again = client.images.generate(model=NOISE, prompt="static", size="4096x4096",
                                   extra_body={"nvext": {"seed": 11}})
    assert hashlib.sha256(base64.b64decode(again.data[0].b64_json)).digest() == hashlib.sha256(raw).digest()


def test_a_20_mb_upload_passes_through_envoy(client):
    noise = Image.frombytes("RGB", (2600, 2600), random.Random(5).randbytes(2600 * 2600 * 3))
    out = io.BytesIO()
    noise.save(out, "PNG", compress_level=1)
    assert len(out.getvalue()) > 20_000_000
    resp = client.images.edit(model=IMAGE, image=("big.png", out.getvalue(), "image/png"), prompt="a hat",
                              size="64x64")
    assert decoded(resp.data[0].b64_json).size == (64, 64)


def test_overload_is_a_503_and_a_client_that_hangs_up_frees_the_worker_within_a_second(mesh, client):
    """The slow model runs one job at a time and keeps its slot until its engine's step loop ends, so the
    moment another request is accepted is the moment the hung-up request's denoising stopped."""
    body = {"model": SLOW, "prompt": "a slow cat", "size": "64x64", "stream": True, "partial_images": 3,
            "nvext": {"num_inference_steps": 100}}  # 5 s unless it is stopped
    with httpx.Client(base_url=mesh.url, timeout=30) as http:
        with http.stream("POST", "/v1/images/generations", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            assert next(lines) == "event: image_generation.partial_image"
            busy = http.post("/v1/images/generations", json={"model": SLOW, "prompt": "x", "size": "64x64"})
            assert busy.status_code == 503 and busy.headers["retry-after"] == "1", busy.text
            assert busy.json()["error"]["type"] == "service_unavailable"
        hung_up = time.monotonic()  # leaving the block closed the connection mid-stream
    while True:
        try:
            client.images.generate(model=SLOW, prompt="x", size="64x64",
                                   extra_body={"nvext": {"num_inference_steps": 1}})
            break
        except openai.InternalServerError as e:
            assert e.status_code == 503
            assert time.monotonic() - hung_up < 5, "the worker never let go of the hung-up request"
    assert time.monotonic() - hung_up < 1.0


def test_requests_are_counted_by_endpoint(client, mesh):
    client.images.generate(model=IMAGE, prompt="a cat", size="64x64")
    client.images.edit(model=IMAGE, image=("in.png", png(), "image/png"), prompt="a hat", size="64x64")
    with pytest.raises(openai.BadRequestError):
        client.images.generate(model=IMAGE, prompt="a cat", size="3x3")
    counts: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{mesh.url}/metrics", timeout=10).text):
        for s in family.samples:
            if s.name == "meshfront_gateway_requests_total" and s.labels["model"] in (IMAGE, ""):
                key = (s.labels["endpoint"], s.labels["status"])
                counts[key] = counts.get(key, 0) + s.value
    assert counts.get(("images", "200"), 0) >= 1 and counts.get(("images_edits", "200"), 0) >= 1
    assert counts.get(("images", "400"), 0) >= 1


def test_the_all_in_one_gateway_serves_images_and_urls(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    m = start_mesh(tmp_path_factory, [mocker(demo_model_dir, DEMO),
                                      mocker(demo_model_dir, IMAGE, "10", "--media", "image")], inproc=True)
    c = sdk_client(m, timeout=60)
    try:
        resp = c.images.generate(model=IMAGE, prompt="a cat", size="64x32", response_format="url")
        fetched = httpx.get(resp.data[0].url, timeout=30)
        assert fetched.status_code == 200 and Image.open(io.BytesIO(fetched.content)).size == (64, 32)
        assert decoded(c.images.generate(model=IMAGE, prompt="a cat", size="32x64").data[0].b64_json).size == (32, 64)
    finally:
        c.close()
        stop_cleanly(m)
