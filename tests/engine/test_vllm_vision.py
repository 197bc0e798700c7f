"""Images through a real vLLM worker (CPU build) serving the demo vision model, kv router, whole mesh.

The tiny random Qwen2-VL (services/models/qwen_vl.py) runs in vLLM's CPU build; images go in as data
URLs through the official openai SDK. Every prompt is two full KV blocks of text (vLLM's CPU block is
128 tokens; the image starts at token 294), a third block holding a 224x224 image (64 tokens), then
text: a different image shares the two text blocks and nothing after them, so the cached and
predicted counts say exactly what the image salted. One worker is enough: the router's predicted hits, which come
from vLLM's own KV events, must equal what vLLM then reports cached, so the two sides' media-salted block hashes
agree (choosing a worker by those hashes is the mesh tier's test_vision.py, with mocker workers).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import urllib.request

import pytest

from services.launcher.media_demos import VISION
from services.launcher.plan import WorkerSpec, ephemeral_plan
from services.launcher.processes import Mesh
from services.launcher.run import VLLM_CPU_FLAGS
from tests.conftest import ROOT, sdk_client, stop_cleanly
from tests.engine.conftest import ENGINE_START_S, wait_workers
from tests.media_samples import data_url, mp4, png
from tests.mesh.conftest import wait_until

pytestmark = pytest.mark.engine

MODEL = "meshfront/demo-qwen-vl"
WORKERS = ("vllm-0",)
BLOCK = 128  # vLLM's CPU block size
IMAGE_TOKENS = 64  # a 224x224 image: (224 / 28) ** 2
VIDEO_TOKENS = 32  # 2 s of 112x112 at 8 fps: 4 frames sampled, 2 temporal patches of (112 / 28) ** 2
PREFIX = " ".join(f"note {i};" for i in range(60))  # 294 tokens before the image: two whole blocks
TEXT_BLOCKS = 2


@pytest.fixture(scope="module")
def vision_model_dir():
    from services.models.qwen_vl import default_vision_model_dir

    return default_vision_model_dir(with_weights=True)


@pytest.fixture(scope="module")
def vision_mesh(tmp_path_factory, vllm_python, vision_model_dir, envoy_bin, nats_bin):
    flags = (*VLLM_CPU_FLAGS, *VISION.vllm_args)
    workers = [WorkerSpec(str(vision_model_dir), MODEL, "vllm", (*flags, "--worker-id", w)) for w in WORKERS]
    plan = ephemeral_plan(workers, router_mode="kv", run_dir=ROOT / ".run" / "tests")
    mesh = Mesh(plan, tmp_path_factory.mktemp("vision-engine-logs"))
    mesh.start(timeout=ENGINE_START_S * 2)
    try:
        wait_workers(mesh.url, MODEL, len(WORKERS), timeout=ENGINE_START_S * 2)
    except AssertionError:
        print(mesh.all_logs())
        stop_cleanly(mesh)
        raise
    yield mesh
    try:
        # A loaded machine can see vLLM's engine core go before its output handler at shutdown, which
        # logs that with a traceback (the requests above were all answered by then).
        stop_cleanly(mesh, expected_tracebacks=("output_handler",))
    finally:
        for name in WORKERS:  # vLLM's engine core can outlive its worker
            with contextlib.suppress(ProcessLookupError):
                os.killpg(mesh.procs[name].pid, signal.SIGKILL)


@pytest.fixture
def client(vision_mesh):
    c = sdk_client(vision_mesh, timeout=300)
    yield c
    c.close()


def router_metrics(mesh: Mesh) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{mesh.plan.metrics_ports['router']}/metrics", timeout=5) as r:
        return r.read().decode()


def predicted(response) -> int:
    """The prompt tokens the router predicted cached on the worker it chose (its decision record)."""
    return response.model_extra["nvext"]["routing"]["predicted_cached_tokens"]


def index_blocks(mesh: Mesh) -> dict[str, float]:
    return {w: float(n) for w, n in re.findall(r'^meshfront_router_kv_index_blocks\{worker="([^"]+)"\} ([0-9.e+]+)$',
                                               router_metrics(mesh), re.M)}


def indexed(mesh: Mesh, client, image_part: dict, tail: str):
    """Sends one request and waits until the router's index holds its image block (the worker's KV events
    arrived), so that a repeat's predicted hit is there to be counted."""
    before = index_blocks(mesh)
    response = ask(client, image_part, tail=tail)
    worker = worker_of(response)
    wait_until(lambda: index_blocks(mesh).get(worker, 0) >= before.get(worker, 0) + 1, 60,
               "the request's blocks in the router's index")
    return response


def ask(client, image: dict | None, tail: str = "what is in it?"):
    content: list[dict] = [{"type": "text", "text": PREFIX}]
    if image is not None:
        content.append(image if "type" in image else {"type": "image_url", **image})
    content.append({"type": "text", "text": " ".join(f"{tail} {i}" for i in range(30))})
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}],
                                          max_tokens=2, temperature=0,
                                          extra_body={"nvext": {"extra_fields": ["worker_id", "routing"]}})


def worker_of(response) -> str:
    return response.model_extra["nvext"]["worker_id"]["decode_worker_id"]


def image(seed: int, uuid: str | None = None, with_url: bool = True) -> dict:
    part: dict = {"image_url": {"url": data_url(png(224, 224, seed=seed))} if with_url else None}
    if uuid is not None:
        part["uuid"] = uuid
    return part


def test_an_image_request_answers_with_the_images_tokens_in_usage(client):
    text_only = ask(client, None, tail="text only")
    with_image = ask(client, image(1), tail="text only")
    assert with_image.usage.completion_tokens >= 1
    # The image's placeholder run, plus the <|vision_start|> and <|vision_end|> around it (and a newline).
    assert IMAGE_TOKENS + 2 <= with_image.usage.prompt_tokens - text_only.usage.prompt_tokens <= IMAGE_TOKENS + 4


def test_the_same_image_again_is_predicted_and_cached(client, vision_mesh):
    first = indexed(vision_mesh, client, image(2), tail="same")
    assert first.usage.prompt_tokens >= (TEXT_BLOCKS + 1) * BLOCK
    again = ask(client, image(2), tail="same")
    # The router found the image's block in vLLM's events under the hash the preprocessor salted it with.
    assert predicted(again) >= (TEXT_BLOCKS + 1) * BLOCK
    # Every full block is cached, the image's included.
    assert again.usage.prompt_tokens_details.cached_tokens >= (TEXT_BLOCKS + 1) * BLOCK


def test_a_different_image_gets_no_predicted_hit_past_the_text_before_it(client, vision_mesh):
    indexed(vision_mesh, client, image(3), tail="different")
    other = ask(client, image(4), tail="different")
    # Only the text blocks are shared: the router predicts them and vLLM reuses them, nothing past them.
    assert predicted(other) == TEXT_BLOCKS * BLOCK
    assert other.usage.prompt_tokens_details.cached_tokens <= TEXT_BLOCKS * BLOCK


def test_a_uuid_names_the_image_sent_before_it(client, vision_mesh):
    first = indexed(vision_mesh, client, image(5, uuid="engine-photo"), tail="uuid")
    again = ask(client, image(5, uuid="engine-photo", with_url=False), tail="uuid")
    assert again.usage.prompt_tokens == first.usage.prompt_tokens
    assert predicted(again) >= (TEXT_BLOCKS + 1) * BLOCK
    assert again.usage.prompt_tokens_details.cached_tokens >= (TEXT_BLOCKS + 1) * BLOCK
    assert again.choices[0].message.content == first.choices[0].message.content


def video(seed: int) -> dict:
    clip = mp4(112, 112, frames=16, fps=8, seed=seed)
    return {"type": "video_url", "video_url": {"url": data_url(clip, "video/mp4")}}


def test_a_video_answers_with_its_tokens_in_usage_and_is_predicted_and_cached(client, vision_mesh):
    text_only = ask(client, None, tail="clip")
    first = indexed(vision_mesh, client, video(1), tail="clip")
    assert first.usage.completion_tokens >= 1
    assert VIDEO_TOKENS + 2 <= first.usage.prompt_tokens - text_only.usage.prompt_tokens <= VIDEO_TOKENS + 4
    assert first.usage.prompt_tokens >= (TEXT_BLOCKS + 1) * BLOCK  # the block holding the video is full
    again = ask(client, video(1), tail="clip")
    assert predicted(again) >= (TEXT_BLOCKS + 1) * BLOCK
    assert again.usage.prompt_tokens_details.cached_tokens >= (TEXT_BLOCKS + 1) * BLOCK
