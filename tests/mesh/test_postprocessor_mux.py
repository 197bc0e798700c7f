"""The gateway's postprocessor client: one multiplexed stream per replica.

Two postprocessor replicas behind one gateway (``--postprocessor ipv4:a,b``), two paced workers (one
token per engine step), Envoy in front: many requests share the two streams, a client that hangs up
cancels only its own request down to the worker, a draining replica finishes its requests and exits
without waiting out its grace while new ones go to the other, a dead replica's requests start over on
the live one, and the streams it was decoding are resumed there, token-identical: a hundred at once at
temperature 0, some of them with reasoning or tool calls half-parsed at the kill.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import signal
import subprocess
import sys
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tokenizers import Tokenizer

from services.launcher.plan import WorkerSpec
from tests.conftest import MOCKER_SCRIPT, stop_cleanly
from tests.mesh.chaos_client import chat, run_streams, stream_chat, stream_then_hang_up
from tests.mesh.conftest import DEMO, DEMO_PARSERS, restored, start_mesh, wait_until

pytestmark = pytest.mark.mesh

POSTPROCESSORS = ("postprocessor", "postprocessor-1")
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
CITIES = ("Paris", "Rome", "Berlin", "Zürich", "Kraków")


def _trip_answer(reasoning: str, calls: list[dict]) -> str:
    return f"<think>\n{reasoning}\n</think>\n\n" + "\n".join(
        "<tool_call>\n" + json.dumps({"name": "get_weather", "arguments": a}, ensure_ascii=False) + "\n</tool_call>"
        for a in calls)


# Two scripted answers of ~400 tokens each: one thinks long and calls two tools, the other thinks briefly
# and calls eight. Both at once, a kill finds the first kind inside its reasoning and the second inside
# its tool calls, even when the gateway is a few hundred tokens ahead of a busy client; emoji and "°" are
# split across tokens at some cuts.
TRIPS = {
    "Plan a long trip": (
        "The user wants a trip 🧳 through " + ", ".join(CITIES * 25) + "; I should check the weather 🌦 of "
        "each city in turn.", [{"city": c, "unit": "°C"} for c in CITIES[:2]]),
    "Plan a quick trip": (
        "Check each city.",
        [{"city": c, "unit": "°C", "note": f"stop {i} of a quick trip 🚆"} for i, c in enumerate(CITIES + CITIES[:3])]),
}


@pytest.fixture(scope="module")
def two_posts(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    script = tmp_path_factory.mktemp("script") / "script.json"
    trips = [{"match": match, "text": _trip_answer(*answer)} for match, answer in TRIPS.items()]
    script.write_text(json.dumps([*json.loads(MOCKER_SCRIPT.read_text()), *trips]))
    # Half speed (~12 ms a token): a hundred streams at full speed outrun a loaded machine's client by far.
    worker = WorkerSpec(str(demo_model_dir), DEMO, "mocker", ("--script", str(script), "--speedup-ratio", "0.5",
                                                              *DEMO_PARSERS))
    m = start_mesh(tmp_path_factory, [worker, worker], postprocessors=2)
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

    with restored(two_posts, "postprocessor-1"):
        disturbed = asyncio.run(run_streams(two_posts.url, bodies, sigterm_when_streaming))
        assert [(r.status, r.error) for r in disturbed if not r.done or r.error] == []
        assert [r.text for r in disturbed] == [r.text for r in reference]
        assert two_posts.procs["postprocessor-1"].wait(30) == 0
        # Its drain grace is 10 s; its streams ended with their requests, so it exits well before.
        assert time.monotonic() - stopped[0] < 8.0
        after = asyncio.run(run_streams(two_posts.url, bodies[:6]))  # one replica left: all of them go there
        assert [r.text for r in after] == [r.text for r in reference[:6]]


def test_requests_of_a_dead_replica_start_over_on_the_live_one(two_posts):
    bodies = [{**chat(DEMO, 200 + i, 8), "ignore_eos": True} for i in range(8)]
    reference = asyncio.run(run_streams(two_posts.url, bodies))
    with restored(two_posts, "postprocessor"):
        two_posts.kill("postprocessor")  # SIGKILL: its stream breaks; the gateway still lists it
        two_posts.procs["postprocessor"].wait(10)
        after = asyncio.run(run_streams(two_posts.url, bodies))
        assert [(r.status, r.error) for r in after if not r.done or r.error] == []
        assert [r.text for r in after] == [r.text for r in reference]
        # Connected replicas rank first, so the dead one is passed over once its channel has seen the loss;
        # a request sent before that breaks with its stream and starts over (either way none fails).
        log = two_posts.full_log("gateway-0")
        assert "is unreachable; starting request" in log or "stream failed" in log


def test_streams_a_killed_replica_was_decoding_finish_on_the_live_one_token_identical(two_posts):
    bodies = [{**chat(DEMO, 300 + i, 120), "ignore_eos": True} for i in range(8)]
    reference = asyncio.run(run_streams(two_posts.url, bodies))
    assert all(r.done and r.error is None for r in reference), reference

    async def kill_once_all_streamed(events: list[asyncio.Event]) -> None:
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 30)
        two_posts.kill("postprocessor")  # SIGKILL mid-stream: every stream it was decoding breaks

    with restored(two_posts, "postprocessor"):
        after = asyncio.run(run_streams(two_posts.url, bodies, kill_once_all_streamed))
        assert [(r.status, r.error) for r in after if not r.done or r.error] == []
        assert [(r.text, r.finish) for r in after] == [(r.text, r.finish) for r in reference]
        # Streams that had their first tokens were resumed, not started over (the gateway's client says which).
        assert "is unreachable; resuming request" in two_posts.full_log("gateway-0")


async def _trip(sdk: openai.AsyncOpenAI, prompt: str) -> tuple[str, dict]:
    """One streamed trip: its id, and what the client saw (reasoning, content, tool calls, finish, usage)."""
    stream = await sdk.chat.completions.create(
        model=DEMO, messages=[{"role": "user", "content": prompt}], tools=TOOLS, temperature=0, stream=True,
        stream_options={"include_usage": True})
    seen: dict = {"reasoning": "", "content": "", "calls": {}, "finish": None, "usage": None}
    request_id = ""
    async for chunk in stream:
        request_id = chunk.id
        if chunk.usage is not None:
            seen["usage"] = chunk.usage.completion_tokens
        for choice in chunk.choices:
            delta = choice.delta
            seen["reasoning"] += (delta.model_extra or {}).get("reasoning_content") or ""
            seen["content"] += delta.content or ""
            for call in delta.tool_calls or ():
                mine = seen["calls"].setdefault(call.index, {"ids": 0, "name": "", "arguments": ""})
                mine["ids"] += bool(call.id)  # announced once, whichever replica announced it
                mine["name"] += call.function.name or ""
                mine["arguments"] += call.function.arguments or ""
            seen["finish"] = choice.finish_reason or seen["finish"]
    return request_id.removeprefix("chatcmpl-"), seen


# Watches the gateway's time-to-first-token count and SIGKILLs a process DELAY s after it reached TARGET:
# in a process of its own, because the test's event loop, busy with a hundred streams, polls late.
KILL_WHEN_UNDER_WAY = """
import os, re, signal, sys, time, urllib.request
url, target, delay, pid = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
count = re.compile(r'^meshfront_gateway_time_to_first_token_seconds_count{[^}]*} (\\S+)$', re.M)
while sum(float(n) for n in count.findall(urllib.request.urlopen(url, timeout=5).read().decode())) < target:
    time.sleep(0.02)
time.sleep(delay)
os.kill(pid, signal.SIGKILL)
"""


def first_outputs(mesh) -> float:
    """Streams whose first output the gateway sent (its time-to-first-token count)."""
    return sum(s.value for f in text_string_to_metric_families(httpx.get(gateway_metrics(mesh), timeout=5).text)
               if f.name == "meshfront_gateway_time_to_first_token_seconds"
               for s in f.samples if s.name.endswith("_count"))


def gateway_metrics(mesh) -> str:
    return f"http://127.0.0.1:{mesh.plan.metrics_ports['gateway-0']}/metrics"


def test_a_hundred_streams_with_reasoning_and_tool_calls_in_flight_survive_a_replica_kill(two_posts,
                                                                                          demo_model_dir):
    """80 plain streams and 20 trips at temperature 0, all at once. The kill comes a second after the
    gateway sent each stream its first output: the quick trips are calling tools, the long ones still
    reasoning, the plain ones under way. (Not when the client sees it: with a hundred streams on a loaded
    machine, this test's event loop reads them hundreds of tokens behind the gateway.)"""
    plain = [{**chat(DEMO, 400 + i, 500), "ignore_eos": True, "temperature": 0} for i in range(80)]
    # Long, quick, quick, long, ...: requests take turns over the replicas, so that each gets both kinds.
    prompts = [f"{match} number {i}" for i in range(10) for match in (TRIPS if i % 2 == 0 else reversed(TRIPS))]

    async def run(kill: bool) -> tuple[list, list[tuple[str, dict]]]:
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
        async with httpx.AsyncClient(timeout=120, limits=limits) as http, openai.AsyncOpenAI(
                base_url=f"{two_posts.url}/v1", api_key="unused", max_retries=0, timeout=120) as sdk:
            if kill:  # ~80 tokens (at the workers' full pace) after every stream's first output
                killer = subprocess.Popen([sys.executable, "-c", KILL_WHEN_UNDER_WAY, gateway_metrics(two_posts),
                                           str(first_outputs(two_posts) + 100), "1.0",
                                           str(two_posts.procs["postprocessor"].pid)])
            streams = [asyncio.create_task(stream_chat(http, two_posts.url, b)) for b in plain]
            trips = [asyncio.create_task(_trip(sdk, p)) for p in prompts]
            if kill:
                assert await asyncio.to_thread(killer.wait, 60) == 0
            return (await asyncio.wait_for(asyncio.gather(*streams), 120),
                    await asyncio.wait_for(asyncio.gather(*trips), 120))

    reference, reference_trips = asyncio.run(run(kill=False))
    assert all(r.done and r.error is None and r.finish == "length" for r in reference), reference
    tokenizer = Tokenizer.from_file(str(demo_model_dir / "tokenizer.json"))
    ends = {}  # prompt -> (tokens of its reasoning block, of its whole answer)
    for prompt, (_, trip) in zip(prompts, reference_trips, strict=True):
        # The parsers see what the script says, so that the comparison below means something.
        reasoning, calls = TRIPS[prompt.split(" number")[0]]
        seen_calls = {i: {**c, "arguments": json.loads(c["arguments"])} for i, c in trip["calls"].items()}
        assert (trip["reasoning"], trip["content"], trip["finish"], seen_calls) == (
            reasoning, "", "tool_calls", {i: {"ids": 1, "name": "get_weather", "arguments": a}
                                          for i, a in enumerate(calls)}), trip
        ends[prompt] = (len(tokenizer.encode(f"<think>\n{reasoning}\n</think>", add_special_tokens=False).ids),
                        len(tokenizer.encode(_trip_answer(reasoning, calls), add_special_tokens=False).ids))
        assert trip["usage"] == ends[prompt][1] + 1, trip  # the answer and its EOS

    logged = len(two_posts.full_log("gateway-0"))
    try:
        streams, trips = asyncio.run(run(kill=True))
        two_posts.procs["postprocessor"].wait(10)
        assert [(r.status, r.error) for r in streams if not r.done or r.error] == []
        assert [(r.text, r.finish) for r in streams] == [(r.text, r.finish) for r in reference]
        assert [trip for _, trip in trips] == [trip for _, trip in reference_trips]  # usage included
        # The kill found streams mid-way: plain ones, and trips inside their reasoning and inside their tool calls.
        cuts = {m[1]: int(m[2]) for m in re.finditer(r"resuming request (\w+) on another replica after (\d+) tokens",
                                                       two_posts.full_log("gateway-0")[logged:])}
        trip_cuts = {p: cuts.pop(rid) for p, (rid, _) in zip(prompts, trips, strict=True) if rid in cuts}
        phases = {p: "reasoning" if 0 < cut <= ends[p][0] else "calls" if ends[p][0] < cut < ends[p][1] else "?"
                  for p, cut in trip_cuts.items()}
        assert len([cut for cut in cuts.values() if 0 < cut < 500]) >= 20, cuts  # the plain ones left
        assert {"reasoning", "calls"} <= set(phases.values()), (trip_cuts, phases)
    finally:
        two_posts.restart("postprocessor")  # the next test needs both replicas, whatever happened here


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
