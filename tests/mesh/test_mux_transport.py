"""The split mesh's multiplexed worker hop: the postprocessor's one GenerateStream per worker."""

from __future__ import annotations

import time
from collections import Counter

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import sdk_client, stop_cleanly
from tests.mesh.conftest import DEMO, mocker, restored, start_mesh, wait_until

pytestmark = pytest.mark.mesh

COUNT = "one two three four five six seven eight nine ten"


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_streaming_and_not_give_the_exact_text(client, mesh):  # the tier's shared mesh (tests/mesh/conftest.py)
    r = client.chat.completions.create(model=DEMO, messages=ask("Count to ten"))
    assert r.choices[0].message.content == COUNT and r.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(model=DEMO, messages=ask("Count to ten"), stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == COUNT
    assert "opened a GenerateStream to worker" in mesh.full_log("postprocessor")


@pytest.fixture(scope="module")
def paced_mux(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    """Two paced workers (one token per engine step)."""
    m = start_mesh(tmp_path_factory, [mocker(demo_model_dir, DEMO, "1"), mocker(demo_model_dir, DEMO, "1")])
    yield m
    stop_cleanly(m)


def worker_sequences(mesh) -> tuple[Counter, float]:
    """Sequences ended per outcome, and sequences in flight, summed over the mesh's workers."""
    ended, in_flight = Counter(), 0.0
    for name, port in mesh.plan.metrics_ports.items():
        if name.startswith("mocker-"):
            for family in text_string_to_metric_families(httpx.get(f"http://127.0.0.1:{port}/metrics").text):
                for sample in family.samples:
                    if sample.name == "meshfront_worker_requests_total":
                        ended[sample.labels["outcome"]] += int(sample.value)
                    elif sample.name == "meshfront_worker_inflight_requests":
                        in_flight += sample.value
    return ended, in_flight


def test_a_stop_string_cancels_the_sequence_on_the_worker(paced_mux):
    # Paced (~6 ms a token) and 3000 tokens long, the sequence runs for ~17 s after its stop string (the 5th
    # token): it can only end as "aborted" if the postprocessor's cancel reached the worker. At speed-up 200 its
    # 400 tokens took ~0.1 s, and a loaded machine let the worker finish them before the cancel came.
    before, _ = worker_sequences(paced_mux)
    client = sdk_client(paced_mux, timeout=60)
    try:
        r = client.chat.completions.create(model=DEMO, messages=ask("Count to ten"), stop=["five"],
                                           extra_body={"ignore_eos": True}, max_tokens=3000)
    finally:
        client.close()
    assert r.choices[0].message.content == "one two three four " and r.choices[0].finish_reason == "stop"
    ended = wait_until(lambda: worker_sequences(paced_mux)[0] - before, 30, "the sequence to end on its worker")
    assert ended == Counter(aborted=1), ended
    assert worker_sequences(paced_mux)[1] == 0


def test_one_stream_carries_many_requests_and_a_cancel_ends_only_its_own(paced_mux):
    import asyncio
    import threading

    from tests.mesh.chaos_client import chat, run_streams, stream_then_hang_up

    bodies = [{**chat(DEMO, i, 48), "ignore_eos": True} for i in range(12)]
    reference = asyncio.run(run_streams(paced_mux.url, bodies))
    aborted = sum(paced_mux.logs(f"mocker-{i}").count("aborted by the caller") for i in range(2))
    hung_up = threading.Thread(target=stream_then_hang_up, args=(paced_mux.plan.http_port, bodies[0], 3))
    hung_up.start()
    disturbed = asyncio.run(run_streams(paced_mux.url, bodies[1:]))
    hung_up.join(30)
    assert [r.text for r in disturbed] == [r.text for r in reference[1:]]
    assert all(r.done and r.finish == "length" for r in disturbed)
    deadline = time.monotonic() + 5
    while sum(paced_mux.logs(f"mocker-{i}").count("aborted by the caller") for i in range(2)) != aborted + 1:
        assert time.monotonic() < deadline, "the hung-up request was not aborted on its worker (alone)"
        time.sleep(0.05)
    assert "opened a GenerateStream to worker" in paced_mux.logs("postprocessor")


def test_a_draining_worker_finishes_its_multiplexed_requests_and_exits_without_waiting_out_its_grace(paced_mux):
    import asyncio
    import signal

    from tests.mesh.chaos_client import chat, run_streams

    bodies = [{**chat(DEMO, 100 + i, 64), "ignore_eos": True} for i in range(16)]
    reference = asyncio.run(run_streams(paced_mux.url, bodies))
    stopped: list[float] = []

    async def sigterm_when_streaming(events):
        await asyncio.gather(*(e.wait() for e in events))
        paced_mux.kill("mocker-1", signal.SIGTERM)
        stopped.append(time.monotonic())

    with restored(paced_mux, "mocker-1"):
        disturbed = asyncio.run(run_streams(paced_mux.url, bodies, sigterm_when_streaming))
        assert [(r.status, r.error) for r in disturbed if not r.done or r.error] == []
        assert [r.text for r in disturbed] == [r.text for r in reference]  # finished there, or moved token-exact
        assert paced_mux.procs["mocker-1"].wait(30) == 0
        # The worker's drain grace is 10 s; its streams ended with their work, so it exits well before.
        assert time.monotonic() - stopped[0] < 8.0

