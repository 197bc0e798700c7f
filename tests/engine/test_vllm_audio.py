"""input_audio through a real vLLM worker (CPU build) serving the demo audio model, kv router, whole mesh.

The worker is the one ``meshfront run --demo-audio --worker-kind vllm`` starts (services/launcher/media_demos.py): a
tiny random Qwen2-Audio (services/models/qwen_audio.py) in vLLM's CPU build. Clips go in as ``input_audio`` parts
through the official openai SDK. Every prompt is two full KV blocks of text (vLLM's CPU block is 128 tokens), then
the clip (4 s: 100 tokens) and text: the same clip again is cached past the text, a different one is not.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal

import pytest

from services.launcher.media_demos import AUDIO
from services.launcher.plan import ephemeral_plan
from services.launcher.processes import Mesh
from services.launcher.run import VLLM_CPU_ARGS, parse_args
from services.models.qwen_audio import NAME
from tests.conftest import ROOT, sdk_client, stop_cleanly
from tests.engine.conftest import ENGINE_START_S, wait_workers
from tests.media_samples import wav

pytestmark = pytest.mark.engine

BLOCK = 128  # vLLM's CPU block size
AUDIO_TOKENS = 100  # 4 s: 400 mel frames, halved twice
PREFIX = " ".join(f"note {i};" for i in range(60))  # ~294 tokens before the clip: two whole blocks
TEXT_BLOCKS = 2


@pytest.fixture(scope="module")
def audio_mesh(tmp_path_factory, vllm_python, envoy_bin, nats_bin):
    args = parse_args(["--demo-audio", "--worker-kind", "vllm"])
    [worker] = AUDIO.workers(args, ROOT / "build" / "models", VLLM_CPU_ARGS)  # the launcher's default engine flags
    plan = ephemeral_plan([worker], router_mode="kv", run_dir=ROOT / ".run" / "tests")
    mesh = Mesh(plan, tmp_path_factory.mktemp("audio-engine-logs"))
    mesh.start(timeout=ENGINE_START_S * 2)
    try:
        wait_workers(mesh.url, NAME, 1, timeout=ENGINE_START_S * 2)
    except AssertionError:
        print(mesh.all_logs())
        stop_cleanly(mesh)
        raise
    yield mesh
    try:
        stop_cleanly(mesh, expected_tracebacks=("output_handler",))  # see test_vllm_vision.py
    finally:
        with contextlib.suppress(ProcessLookupError):  # vLLM's engine core can outlive its worker
            os.killpg(mesh.procs["vllm-0"].pid, signal.SIGKILL)


def ask(client, clip: bytes | None, tail: str):
    content: list[dict] = [{"type": "text", "text": PREFIX}]
    if clip is not None:
        content.append({"type": "input_audio", "input_audio": {"data": base64.b64encode(clip).decode(),
                                                               "format": "wav"}})
    content.append({"type": "text", "text": " ".join(f"{tail} {i}" for i in range(30))})
    return client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": content}],
                                          max_tokens=2, temperature=0)


def test_an_audio_request_answers_with_its_tokens_in_usage_and_is_cached_again(audio_mesh):
    with sdk_client(audio_mesh, timeout=300) as client:
        text_only = ask(client, None, tail="heard")
        first = ask(client, wav(4.0, seed=1), tail="heard")
        assert first.usage.completion_tokens >= 1
        # The clip's <|AUDIO|> run, between <|audio_bos|> and <|audio_eos|> (and a newline).
        assert first.usage.prompt_tokens - text_only.usage.prompt_tokens == AUDIO_TOKENS + 3
        assert first.usage.prompt_tokens >= (TEXT_BLOCKS + 1) * BLOCK  # the block holding the clip is full
        again = ask(client, wav(4.0, seed=1), tail="heard")
        assert again.usage.prompt_tokens_details.cached_tokens >= (TEXT_BLOCKS + 1) * BLOCK
        assert again.choices[0].message.content == first.choices[0].message.content
        other = ask(client, wav(4.0, seed=2), tail="heard")  # the same length: the same token ids, another salt
        assert other.usage.prompt_tokens == first.usage.prompt_tokens
        assert other.usage.prompt_tokens_details.cached_tokens <= TEXT_BLOCKS * BLOCK
