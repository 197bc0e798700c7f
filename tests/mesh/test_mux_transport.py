"""The split mesh with the postprocessor on the multiplexed worker transport (--worker-transport mux)."""

from __future__ import annotations

import time

import pytest

from tests.mesh.conftest import DEMO, DEMO_PARSERS, mocker, start_mesh
from tests.conftest import sdk_client, stop_cleanly

pytestmark = pytest.mark.mesh

COUNT = "one two three four five six seven eight nine ten"


@pytest.fixture(scope="module")
def mux_mesh(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    m = start_mesh(tmp_path_factory, [mocker(demo_model_dir, DEMO, "200", *DEMO_PARSERS)],
                   service_args={"postprocessor": ("--worker-transport", "mux")})
    yield m
    stop_cleanly(m)


@pytest.fixture
def client(mux_mesh):
    c = sdk_client(mux_mesh, timeout=30)
    yield c
    c.close()


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_streaming_and_not_give_the_exact_text(client, mux_mesh):
    r = client.chat.completions.create(model=DEMO, messages=ask("Count to ten"))
    assert r.choices[0].message.content == COUNT and r.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(model=DEMO, messages=ask("Count to ten"), stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == COUNT
    assert "opened a GenerateStream to worker" in mux_mesh.logs("postprocessor")


def test_a_stop_string_cancels_the_sequence_on_the_worker(client, mux_mesh):
    before = mux_mesh.logs("mocker-0").count("aborted by the caller")
    r = client.chat.completions.create(model=DEMO, messages=ask("Count to ten"), stop=["five"],
                                       extra_body={"ignore_eos": True}, max_tokens=400)
    assert r.choices[0].message.content == "one two three four " and r.choices[0].finish_reason == "stop"
    deadline = time.monotonic() + 5
    while mux_mesh.logs("mocker-0").count("aborted by the caller") == before:
        assert time.monotonic() < deadline, "the worker never heard of the cancel"
        time.sleep(0.05)
