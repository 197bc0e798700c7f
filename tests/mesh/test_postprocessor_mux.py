"""The gateway's postprocessor client: one multiplexed stream per replica.

Two postprocessor replicas behind one gateway (``--postprocessor ipv4:a,b``), two paced workers (one
token per engine step), Envoy in front: many requests share the two streams, a client that hangs up
cancels only its own request down to the worker, a draining replica finishes its requests and exits
without waiting out its grace while new ones go to the other, a dead replica's requests start over on
the live one, and the streams it was decoding are resumed there, token-identical.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import signal
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import stop_cleanly
from tests.mesh.chaos_client import chat, run_streams, stream_then_hang_up
from tests.mesh.conftest import DEMO, mocker, start_mesh, wait_until

pytestmark = pytest.mark.mesh

POSTPROCESSORS = ("postprocessor", "postprocessor-1")


@pytest.fixture(scope="module")
def two_posts(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    m = start_mesh(tmp_path_factory, [mocker(demo_model_dir, DEMO, "1"), mocker(demo_model_dir, DEMO, "1")],
                   postprocessors=2)
    yield m
    stop_cleanly(m)


def aborted(mesh) -> int:
    return sum(mesh.full_log(f"mocker-{i}").count("aborted by the caller") for i in range(2))


def test_requests_share_one_stream_per_replica_and_a_hang_up_cancels_only_its_own(two_posts):
    bodies = [{**chat(DEMO, i, 48), "ignore_eos": True} for i in range(12)]
    reference = asyncio.run(run_streams(two_posts.url, bodies))
    assert all(r.done and r.finish == "length" for r in reference)
    # One stream per replica, not one per request.
    assert two_posts.full_log("gateway-0").count("opened a GenerateStream to postprocessor") == 2
    for name in POSTPROCESSORS:  # least-open-requests spreads the load over both
        assert "opened a GenerateStream to worker" in two_posts.full_log(name), name

    before = aborted(two_posts)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        hung_up = pool.submit(stream_then_hang_up, two_posts.plan.http_port, bodies[0], 3)
        disturbed = asyncio.run(run_streams(two_posts.url, bodies[1:]))
        hung_up.result(30)  # re-raises what the hanging-up client saw go wrong (a stream that never came)
    assert [r.text for r in disturbed] == [r.text for r in reference[1:]]
    assert all(r.done and r.finish == "length" for r in disturbed)
    # The cancel crossed both multiplexed hops: gateway -> postprocessor -> worker, for that request alone.
    wait_until(lambda: aborted(two_posts) == before + 1, 5, "the hung-up request to be aborted on its worker (alone)")
    assert two_posts.full_log("gateway-0").count("opened a GenerateStream to postprocessor") == 2


def test_a_draining_replica_finishes_its_requests_and_new_ones_go_to_the_other(two_posts):
    bodies = [{**chat(DEMO, 100 + i, 64), "ignore_eos": True} for i in range(16)]
    reference = asyncio.run(run_streams(two_posts.url, bodies))
    stopped: list[float] = []

    async def sigterm_when_streaming(events):
        await asyncio.gather(*(e.wait() for e in events))
        two_posts.kill("postprocessor-1", signal.SIGTERM)
        stopped.append(time.monotonic())

    disturbed = asyncio.run(run_streams(two_posts.url, bodies, sigterm_when_streaming))
    assert [(r.status, r.error) for r in disturbed if not r.done or r.error] == []
    assert [r.text for r in disturbed] == [r.text for r in reference]
    assert two_posts.procs["postprocessor-1"].wait(30) == 0
    # Its drain grace is 10 s; its streams ended with their requests, so it exits well before.
    assert time.monotonic() - stopped[0] < 8.0
    after = asyncio.run(run_streams(two_posts.url, bodies[:6]))  # one replica left: all of them go there
    assert [r.text for r in after] == [r.text for r in reference[:6]]
    two_posts.restart("postprocessor-1")


def test_requests_of_a_dead_replica_start_over_on_the_live_one(two_posts):
    bodies = [{**chat(DEMO, 200 + i, 8), "ignore_eos": True} for i in range(8)]
    reference = asyncio.run(run_streams(two_posts.url, bodies))
    two_posts.kill("postprocessor")  # SIGKILL: its stream breaks; the gateway still lists it
    two_posts.procs["postprocessor"].wait(10)
    after = asyncio.run(run_streams(two_posts.url, bodies))
    assert [(r.status, r.error) for r in after if not r.done or r.error] == []
    assert [r.text for r in after] == [r.text for r in reference]
    # Connected replicas rank first, so the dead one is passed over once its channel has seen the loss;
    # a request sent before that breaks with its stream and starts over (either way none fails).
    log = two_posts.full_log("gateway-0")
    assert "is unreachable; starting request" in log or "stream failed" in log
    two_posts.restart("postprocessor")


def test_streams_a_killed_replica_was_decoding_finish_on_the_live_one_token_identical(two_posts):
    bodies = [{**chat(DEMO, 300 + i, 120), "ignore_eos": True} for i in range(8)]
    reference = asyncio.run(run_streams(two_posts.url, bodies))
    assert all(r.done and r.error is None for r in reference), reference

    async def kill_once_all_streamed(events: list[asyncio.Event]) -> None:
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 30)
        two_posts.kill("postprocessor")  # SIGKILL mid-stream: every stream it was decoding breaks

    after = asyncio.run(run_streams(two_posts.url, bodies, kill_once_all_streamed))
    two_posts.procs["postprocessor"].wait(10)
    assert [(r.status, r.error) for r in after if not r.done or r.error] == []
    assert [(r.text, r.finish) for r in after] == [(r.text, r.finish) for r in reference]
    # Streams that had their first tokens were resumed, not started over (the gateway's client says which).
    assert "is unreachable; resuming request" in two_posts.full_log("gateway-0")
    two_posts.restart("postprocessor")


def served_messages(mesh, name: str) -> float:
    """Messages the replica ``name`` has sent on its gateway-facing GenerateStream (its Prometheus counter)."""
    text = httpx.get(f"http://127.0.0.1:{mesh.plan.metrics_ports[name]}/metrics", timeout=5).text
    return sum(s.value for f in text_string_to_metric_families(text) if f.name == "meshfront_mux_messages"
               for s in f.samples if s.name.endswith("_total") and s.labels["rpc"] == "postprocessor.GenerateStream")


def test_one_request_at_a_time_takes_turns_over_the_replicas(two_posts):
    """At low load every replica has nothing open; ties take turns instead of the first taking it all."""

    def one(i: int) -> None:
        [r] = asyncio.run(run_streams(two_posts.url, [{**chat(DEMO, 200 + i, 4), "ignore_eos": True}]))
        assert r.done and r.finish == "length"

    def counts() -> dict[str, float]:
        return {name: served_messages(two_posts, name) for name in POSTPROCESSORS}

    # A replica an earlier test restarted is passed over for a while (its stream broke, its channel
    # reconnects): first, requests until both are serving again.
    start, deadline = counts(), time.monotonic() + 20
    i = 0
    while not all(n > start[name] for name, n in counts().items()):
        assert time.monotonic() < deadline, "one request at a time never reached both replicas"
        one(i)
        i += 1
    # Then, with both usable and idle between requests, six in a row reach both.
    before = counts()
    for j in range(6):
        one(100 + j)
    after = counts()
    assert all(after[name] > before[name] for name in POSTPROCESSORS), (before, after)
