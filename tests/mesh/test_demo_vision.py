"""`meshfront run --demo-vision` on the mocker: the launcher's own worker spec serves meshfront/demo-qwen-vl, and an
image or a video takes the token count the model directory's Qwen2-VL bounds give it."""

from __future__ import annotations

import pytest

from services.launcher.media_demos import VISION
from services.launcher.run import VLLM_CPU_ARGS, parse_args
from services.models.build import REPO_ROOT
from services.models.qwen_vl import NAME
from tests.conftest import sdk_client, stop_cleanly
from tests.media_samples import data_url, mp4, png
from tests.mesh.conftest import start_mesh

pytestmark = pytest.mark.mesh


@pytest.fixture(scope="module")
def demo_vision_mesh(tmp_path_factory, envoy_bin, nats_bin):
    workers = VISION.workers(parse_args(["--demo-vision", "--speedup-ratio", "200"]), REPO_ROOT / "build" / "models",
                             VLLM_CPU_ARGS)
    m = start_mesh(tmp_path_factory, workers)
    yield m
    stop_cleanly(m)


def ask(client, *content):
    messages = [{"role": "user", "content": list(content)}]
    return client.chat.completions.create(model=NAME, max_tokens=1, messages=messages)


# 640x480 is scaled into the 224x224 bound keeping its shape: 6x9 tiles of 28 px.
@pytest.mark.parametrize(("size", "tokens"), [((112, 112), 16), ((640, 480), 54), ((30, 30), 4)])
def test_an_image_takes_the_demo_models_qwen2_vl_count(demo_vision_mesh, size, tokens):
    with sdk_client(demo_vision_mesh, timeout=60) as client:
        assert NAME in [m.id for m in client.models.list()]
        text = {"type": "text", "text": "What is in the picture?"}
        alone = ask(client, text)
        with_image = ask(client, {"type": "image_url", "image_url": {"url": data_url(png(*size))}}, text)
    # Its placeholder run, between <|vision_start|> and <|vision_end|> (and a newline before the text).
    assert with_image.usage.prompt_tokens - alone.usage.prompt_tokens == tokens + 3


# Frames sampled 2 a second (at least 4), in temporal patches of 2, each frame within the video processor's bounds:
# the demo has no video_preprocessor_config.json, so they are preprocessor_config.json's (224x224), as in vLLM.
@pytest.mark.parametrize(("size", "frames", "fps", "tokens"), [((56, 56), 4, 2, 2 * 4), ((112, 112), 40, 8, 5 * 16),
                                                              ((640, 480), 6, 30, 2 * 54)])
def test_a_video_takes_the_demo_models_qwen2_vl_count(demo_vision_mesh, size, frames, fps, tokens):
    with sdk_client(demo_vision_mesh, timeout=60) as client:
        text = {"type": "text", "text": "What happens in the clip?"}
        alone = ask(client, text)
        clip = data_url(mp4(*size, frames=frames, fps=fps), "video/mp4")
        with_video = ask(client, {"type": "video_url", "video_url": {"url": clip}}, text)
    assert with_video.usage.prompt_tokens - alone.usage.prompt_tokens == tokens + 3
