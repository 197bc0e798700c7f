"""stream_interval: tokens gathered into fewer streamed events, the output unchanged.

A paced mocker (one token per engine step, as a real engine gives) behind a mesh whose gateways
default to ``--stream-interval 4``; requests override it with ``nvext.stream_interval``.
"""

from __future__ import annotations

import pytest

from tests.conftest import sdk_client, stop_cleanly
from tests.mesh.conftest import DEMO, mocker, start_mesh

pytestmark = pytest.mark.mesh

MESSAGES = [{"role": "user", "content": "Tell me about the sea"}]
TOKENS = 40


@pytest.fixture(scope="module")
def paced(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    m = start_mesh(tmp_path_factory, [mocker(demo_model_dir, DEMO, "1")],
                   service_args={"gateway": ("--stream-interval", "4")})
    client = sdk_client(m, timeout=60)
    yield client
    client.close()
    stop_cleanly(m)


def _stream(client, interval: int | None) -> tuple[str, list[int]]:
    """The streamed text and the completion tokens each event carried (from usage deltas per chunk)."""
    extra = {"nvext": {"stream_interval": interval}} if interval is not None else {}
    chunks = list(client.chat.completions.create(model=DEMO, messages=MESSAGES, max_tokens=TOKENS, seed=7,
                                                 stream=True, extra_body={"ignore_eos": True, **extra}))
    texts = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    return "".join(texts), [len(t) for t in texts if t]


def test_every_interval_streams_what_the_non_streamed_answer_says(paced):
    whole = paced.chat.completions.create(model=DEMO, messages=MESSAGES, max_tokens=TOKENS, seed=7,
                                          extra_body={"ignore_eos": True}).choices[0].message.content
    events = {}
    for interval in (1, 2, 8, None):
        text, pieces = _stream(paced, interval)
        assert text == whole, interval
        events[interval] = len(pieces)
    # One token per engine step: about one event per token at 1; the deployment's 4 and the request's 8
    # gather them (the first token always goes alone).
    assert events[1] >= TOKENS // 2
    assert events[2] <= TOKENS // 2 + 2
    assert events[None] <= TOKENS // 4 + 2
    assert events[8] <= TOKENS // 8 + 2


def test_a_bad_stream_interval_is_a_400_naming_it(paced):
    import openai

    for bad in (0, -1, 1025, "4", 2.5):
        with pytest.raises(openai.BadRequestError) as e:
            paced.chat.completions.create(model=DEMO, messages=MESSAGES, max_tokens=4,
                                          extra_body={"nvext": {"stream_interval": bad}})
        assert e.value.body["param"] == "nvext.stream_interval", bad
