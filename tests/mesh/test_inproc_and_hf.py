"""The all-in-one shape (stages inside the gateway) and a real transformers worker, through Envoy."""

from __future__ import annotations

import pytest

from services.launcher.plan import WorkerSpec
from tests.conftest import TINY_LM_DIR, sdk_client, stop_cleanly
from tests.mesh.conftest import DEMO, mocker, start_mesh

pytestmark = pytest.mark.mesh

TINY = "tiny-qwen2"


@pytest.fixture(scope="module")
def inproc_mesh(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    from services.models.build import build_demo_model

    tiny_dir = build_demo_model(TINY_LM_DIR, name=TINY, with_weights=True)
    m = start_mesh(tmp_path_factory, [mocker(demo_model_dir, DEMO), WorkerSpec(str(tiny_dir), TINY, "hf")],
                   inproc=True)
    yield m
    stop_cleanly(m)


@pytest.fixture
def client(inproc_mesh):
    c = sdk_client(inproc_mesh, timeout=60)
    yield c
    c.close()


def test_inproc_shape_streams_the_same_text(client):
    r = client.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": "Count to ten"}])
    assert r.choices[0].message.content == "one two three four five six seven eight nine ten"
    chunks = list(client.chat.completions.create(model=DEMO, stream=True,
                                                 messages=[{"role": "user", "content": "Count to ten"}]))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == r.choices[0].message.content


def test_hf_worker_generates_real_tokens(client):
    kw = dict(model=TINY, messages=[{"role": "user", "content": "Hello there"}], max_tokens=8, temperature=0,
              extra_body={"ignore_eos": True})
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    assert a.usage.completion_tokens == 8 and a.choices[0].finish_reason == "length"
    assert a.choices[0].message.content == b.choices[0].message.content  # greedy is deterministic
    assert a.usage.prompt_tokens > 5
    stream = list(client.completions.create(model=TINY, prompt="The mesh", max_tokens=6, stream=True,
                                            extra_body={"ignore_eos": True}))
    assert sum(1 for c in stream if c.choices and c.choices[0].text) >= 1


def test_inproc_shape_serves_the_anthropic_api(inproc_mesh):
    import anthropic

    claude = anthropic.Anthropic(base_url=inproc_mesh.url, api_key="unused", max_retries=0, timeout=60)
    try:
        ask = [{"role": "user", "content": "Count to ten"}]
        m = claude.messages.create(model=DEMO, max_tokens=64, messages=ask)
        assert m.content[0].text == "one two three four five six seven eight nine ten" and m.stop_reason == "end_turn"
        with claude.messages.stream(model=DEMO, max_tokens=64, messages=ask) as s:
            assert "".join(s.text_stream) == m.content[0].text
        assert claude.messages.count_tokens(model=DEMO, messages=ask).input_tokens == m.usage.input_tokens + (
            m.usage.cache_read_input_tokens or 0)
    finally:
        claude.close()
