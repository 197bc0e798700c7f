"""`meshfront run --demo-audio` on the mocker: the launcher's own worker spec serves meshfront/demo-qwen-audio, an
input_audio clip takes the token count Qwen2-Audio's processor gives it, and what is not a usable clip is a 400
naming input_audio.data (through the openai SDK)."""

from __future__ import annotations

import base64

import openai
import pytest

from services.launcher.media_demos import AUDIO
from services.launcher.run import VLLM_CPU_ARGS, parse_args
from services.models.build import REPO_ROOT
from services.models.qwen_audio import NAME
from tests.conftest import sdk_client, stop_cleanly
from tests.media_samples import mp3, png, wav
from tests.mesh.conftest import start_mesh

pytestmark = pytest.mark.mesh

TEXT = {"type": "text", "text": "What is said in the recording?"}


@pytest.fixture(scope="module")
def demo_audio_mesh(tmp_path_factory, envoy_bin, nats_bin):
    workers = AUDIO.workers(parse_args(["--demo-audio", "--speedup-ratio", "200"]), REPO_ROOT / "build" / "models",
                            VLLM_CPU_ARGS)
    m = start_mesh(tmp_path_factory, workers)
    yield m
    stop_cleanly(m)


def clip(raw: bytes, fmt: str = "wav") -> dict:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(raw).decode(), "format": fmt}}


def ask(client, *content):
    messages = [{"role": "user", "content": list(content)}]
    return client.chat.completions.create(model=NAME, max_tokens=1, messages=messages)


# 100 mel frames a second, halved twice (Qwen2-Audio's processor: tests/unit/models/test_qwen_audio.py).
@pytest.mark.parametrize(("seconds", "tokens"), [(0.3, 7), (1.0, 25), (2.5, 62)])
def test_a_clip_takes_the_demo_models_qwen2_audio_count(demo_audio_mesh, seconds, tokens):
    with sdk_client(demo_audio_mesh, timeout=60) as client:
        assert NAME in [m.id for m in client.models.list()]
        alone = ask(client, TEXT)
        with_audio = ask(client, clip(wav(seconds)), TEXT)
    # Its <|AUDIO|> run between <|audio_bos|> and <|audio_eos|>, and a newline before the text.
    assert with_audio.usage.prompt_tokens - alone.usage.prompt_tokens == tokens + 3


@pytest.mark.parametrize(("raw", "fmt", "why"), [
    (png(16, 16), "wav", "it is not wav audio this service can decode"),
    (mp3(0.5), "wav", "it is not wav audio this service can decode"),
    (wav(0.5), "mp3", "it is not mp3 audio this service can decode"),
    (wav(31, rate=8000, channels=1), "wav", "it is longer than the 30-second limit"),
])
def test_what_is_not_a_usable_clip_is_a_400_naming_input_audio_data(demo_audio_mesh, raw, fmt, why):
    with sdk_client(demo_audio_mesh, timeout=60) as client, pytest.raises(openai.BadRequestError) as e:
        ask(client, TEXT, clip(raw, fmt))
    assert e.value.body["message"] == f"'messages[0].content[1].input_audio.data': {why}"
    assert e.value.body["param"] == "messages[0].content"
