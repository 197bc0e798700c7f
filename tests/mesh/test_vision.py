"""Image input through the whole mesh with the openai SDK: four image-declaring mockers under kv routing.

The preprocessor fetches and decodes each image once, expands its placeholder to Qwen2-VL's size-derived
token count and salts the block hashes with its content hash; the mockers store blocks under the same
salted hashes. So the same image twice goes to the same worker with cached tokens, a different image gets
no predicted hit, and a uuid names an image sent before. URL limits are checked against a local HTTP
server (this mesh allows loopback; tests/mesh/test_extensions.py checks the refusal with the default).
"""

from __future__ import annotations

import contextlib
import http.server
import os
import re
import threading
import time
import urllib.request

import openai
import pytest

from services.launcher.plan import free_port
from services.workers.kv_events import LOAD_INTERVAL_S
from tests.conftest import sdk_client, stop_cleanly
from tests.media_samples import data_url, mp4, png
from tests.mesh.conftest import DEMO, mocker, start_mesh

pytestmark = [pytest.mark.mesh, pytest.mark.timeout(180)]

TEXT = " ".join(["river garden apple stone light bread music window"] * 12)  # ~100 tokens after the image
CAT = png(224, 224, seed=11)  # 8 x 8 tiles of 28 px: 64 image tokens
MAX_BYTES = 1_000_000


class Files(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path == "/cat.png":
            self._send(200, CAT)
        elif self.path == "/big.png":
            self._send(200, png(700, 700, seed=2))  # ~1.5 MB of noise: over MAX_BYTES
        elif self.path.startswith("/hop/"):
            n = int(self.path.rsplit("/", 1)[1])
            self.send_response(302)
            self.send_header("Location", "/cat.png" if n == 0 else f"/hop/{n - 1}")
            self.end_headers()
        elif self.path == "/slow.png":
            threading.Event().wait(4)
            self._send(200, CAT)
        elif self.path == "/text.png":
            self._send(200, b"these bytes are no image")
        else:
            self._send(404, b"no")

    def _send(self, status, body):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError):
            self.wfile.write(body)


@pytest.fixture(scope="module")
def files():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Files)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


@pytest.fixture(scope="module")
def vision_mesh(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    metrics_port = free_port()
    old = os.environ.get("MESHFRONT_ROUTER_METRICS_PORT")
    os.environ["MESHFRONT_ROUTER_METRICS_PORT"] = str(metrics_port)
    media = ("--input-modalities", "image,video")
    pre = ("--media-allow-private-urls", "--media-max-bytes", str(MAX_BYTES), "--media-max-redirects", "2",
           "--media-fetch-timeout-s", "2", "--media-max-items", "4")
    try:
        m = start_mesh(tmp_path_factory, [mocker(demo_model_dir, DEMO, "200", *media) for _ in range(4)],
                       router_mode="kv", service_args={"preprocessor": pre})
    finally:
        if old is None:
            os.environ.pop("MESHFRONT_ROUTER_METRICS_PORT")
        else:
            os.environ["MESHFRONT_ROUTER_METRICS_PORT"] = old
    m.metrics_port = m.plan.metrics_ports.get("router", metrics_port)
    yield m
    stop_cleanly(m)


@pytest.fixture
def client(vision_mesh):
    c = sdk_client(vision_mesh, timeout=60)
    yield c
    c.close()


def router_metrics(mesh) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{mesh.metrics_port}/metrics", timeout=5) as r:
        return r.read().decode()


def predicted(mesh) -> float:
    m = re.search(r"^meshfront_router_predicted_cached_tokens_total ([0-9.e+]+)$", router_metrics(mesh), re.M)
    return float(m.group(1)) if m else 0.0


def index_blocks(mesh) -> dict[str, float]:
    return {w: float(n) for w, n in re.findall(r'^meshfront_router_kv_index_blocks\{worker="([^"]+)"\} ([0-9.e+]+)$',
                                               router_metrics(mesh), re.M)}


def indexed(mesh, client, *parts, tail: str):
    """Sends one request and waits until the router's index holds its blocks (the worker's KV events arrived),
    without sending anything else that could land the same prefix on a second worker.

    The count must also stop changing for longer than a worker's report interval: an earlier test's blocks,
    reported late by the same worker, could otherwise make up the +8 while this request's are still on the way.
    """
    before = index_blocks(mesh)
    response = ask(client, *parts, tail=tail)
    worker = worker_of(response)
    deadline, last = time.monotonic() + 10, None
    while (count := index_blocks(mesh).get(worker, 0)) != last or count < before.get(worker, 0) + 8:
        assert time.monotonic() < deadline, "timed out waiting for the request's blocks in the router's index"
        last = count
        time.sleep(LOAD_INTERVAL_S + 0.1)
    return response


def image_part(url=None, uuid=None) -> dict:
    part: dict = {"type": "image_url", "image_url": None if url is None else {"url": url}}
    if uuid is not None:
        part["uuid"] = uuid
    return part


def ask(client, *parts, tail: str = "one", max_tokens: int = 2, explain: bool = False):
    """The image first: every block of the prompt holds or follows it. ``explain``: with the routing decision."""
    content = [*parts, {"type": "text", "text": f"{TEXT} {tail}"}]
    fields = ["worker_id", "routing"] if explain else ["worker_id"]
    return client.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": content}],
                                          max_tokens=max_tokens, extra_body={"nvext": {"extra_fields": fields}})


def worker_of(response) -> str:
    return response.model_extra["nvext"]["worker_id"]["decode_worker_id"]


def refused(client, *parts, param: str = "messages[0].content") -> str:
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, *parts)
    assert e.value.status_code == 400 and e.value.body["param"] == param, e.value.body
    return e.value.body["message"]


def test_image_tokens_count_in_usage(client):
    text_only = client.chat.completions.create(model=DEMO, max_tokens=1, messages=[
        {"role": "user", "content": [{"type": "text", "text": f"{TEXT} one"}]}])
    small = ask(client, image_part(data_url(png(224, 224, seed=1))), max_tokens=1)
    large = ask(client, image_part(data_url(png(448, 448, seed=1))), max_tokens=1)
    # Qwen2-VL: 224 px -> 8 x 8 tiles, 448 px -> 16 x 16; plus the vision start/end markers around them.
    assert large.usage.prompt_tokens - small.usage.prompt_tokens == 256 - 64
    assert small.usage.prompt_tokens - text_only.usage.prompt_tokens >= 64 + 2
    video = ask(client, {"type": "video_url", "video_url": {"url": data_url(mp4(56, 56, frames=4), "video/mp4")}},
                max_tokens=1)
    assert video.usage.prompt_tokens > text_only.usage.prompt_tokens
    # Frames are sampled 2 a second but never fewer than 4 (services/common/video_frames.py): a 1-second
    # 30-frame clip of the same size takes the same 2 temporal patches as the 4-frame one.
    short = ask(client, {"type": "video_url", "video_url": {"url": data_url(mp4(56, 56, frames=30, fps=30),
                                                                             "video/mp4")}}, max_tokens=1)
    assert short.usage.prompt_tokens == video.usage.prompt_tokens


def test_the_same_image_goes_to_the_same_worker_with_cached_tokens(vision_mesh, client):
    url = data_url(CAT)
    first = indexed(vision_mesh, client, image_part(url), tail="first")
    for tail in ("two", "three", "four"):
        again = ask(client, image_part(url), tail=tail, explain=True)
        assert worker_of(again) == worker_of(first), again.model_extra["nvext"]["routing"]  # what the router saw
        assert again.usage.prompt_tokens_details.cached_tokens >= 64 + 64, again.usage


def test_a_different_image_gets_no_predicted_hit(vision_mesh, client):
    indexed(vision_mesh, client, image_part(data_url(png(224, 224, seed=12))), tail="seed")
    before = predicted(vision_mesh)
    other = ask(client, image_part(data_url(png(224, 224, seed=13))), tail="seed")  # same size, same text
    assert predicted(vision_mesh) == before  # not one block: the first block already holds the image
    assert other.usage.prompt_tokens_details is None or other.usage.prompt_tokens_details.cached_tokens == 0


def test_a_uuid_names_an_image_sent_before(vision_mesh, client):
    first = indexed(vision_mesh, client, image_part(data_url(png(224, 224, seed=21)), uuid="photo-21"), tail="uuid")
    again = ask(client, image_part(uuid="photo-21"), tail="uuid")  # no URL: the image sent with that uuid
    assert again.usage.prompt_tokens == first.usage.prompt_tokens
    assert worker_of(again) == worker_of(first) and again.usage.prompt_tokens_details.cached_tokens >= 128
    message = refused(client, image_part(uuid="never-sent"))
    assert "'messages[0].content[0].uuid'" in message and "never-sent" in message


def test_url_fetch_limits(client, files):
    assert ask(client, image_part(f"{files}/cat.png"), max_tokens=1).usage.prompt_tokens > 64
    assert ask(client, image_part(f"{files}/hop/1"), max_tokens=1).usage.prompt_tokens > 64  # two redirects
    for path, why in (("/big.png", f"limit is {MAX_BYTES}"), ("/hop/2", "redirects more than 2 times"),
                      ("/slow.png", "longer than 2 s"), ("/text.png", "not an image"), ("/missing.png", "HTTP 404")):
        message = refused(client, image_part(f"{files}{path}"))
        assert "'messages[0].content[0].image_url.url'" in message and why in message, message
    assert "5 media parts; the limit is 4" in refused(client, *[image_part(f"{files}/cat.png")] * 5,
                                                      param="messages")


def test_oversize_and_non_image_data_urls_are_400(client):
    assert "limit" in refused(client, image_part(data_url(png(700, 700, seed=3))))
    assert "not an image" in refused(client, image_part(data_url(b"GIF89a but not really")))
    assert "not a video" in refused(client, {"type": "video_url", "video_url": {
        "url": data_url(b"no frames here", "video/mp4")}})


def test_undeclared_modalities_are_400(client):
    audio = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, audio)
    assert "does not accept audio input (it accepts: image, video)" in e.value.body["message"]
    assert e.value.body["param"] == "messages" and e.value.body["code"] == "unsupported_modality"
