"""Disaggregated prefill and decode on a live mesh: two prefill mockers, two decode mockers, the router picking
a pair per request and the postprocessor running the two legs (docs/architecture.md, "Disaggregated prefill
and decode").

The mockers run in their default pseudo-random mode, whose tokens are a function of the whole context, so a
disaggregated, migrated or retried answer must be token-identical to an undisturbed aggregated one. Decode
workers model a slow link (20 MB blocks at 2 GB/s) so that a transfer lasts long enough to hang up in.
"""

from __future__ import annotations

import asyncio
import datetime
import re
import socket
import time

import httpx
import orjson
import pytest

from services.launcher.plan import WorkerSpec
from tests.conftest import sdk_client, stop_cleanly
from tests.mesh.chaos_client import chat, run_streams
from tests.mesh.conftest import DEMO, start_mesh, wait_until
from tests.mesh.test_metrics import parse, value

pytestmark = pytest.mark.mesh

SPEEDUP = "0.5"  # real engine pacing halved: ~12 ms a token
PREFILL = {"mocker-0": "prefill-0", "mocker-1": "prefill-1"}
DECODE = {"mocker-2": "decode-0", "mocker-3": "decode-1"}
SLOW_LINK = ("--kv-block-bytes", str(20_000_000), "--kv-transfer-bandwidth-gbs", "2")


def spec(model_dir, role: str, worker_id: str, *extra: str) -> WorkerSpec:
    return WorkerSpec(str(model_dir), DEMO, "mocker", ("--speedup-ratio", SPEEDUP, "--disaggregation-mode", role,
                                                       "--worker-id", worker_id, *extra))


@pytest.fixture(scope="module")
def disagg_mesh(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    workers = [*(spec(demo_model_dir, "prefill", w) for w in PREFILL.values()),
               *(spec(demo_model_dir, "decode", w, *SLOW_LINK) for w in DECODE.values())]
    m = start_mesh(tmp_path_factory, workers, router_mode="kv",
                   service_args={"postprocessor": ("--stream-idle-timeout-s", "2")})
    yield m
    stop_cleanly(m)


@pytest.fixture
def client(disagg_mesh):
    c = sdk_client(disagg_mesh, timeout=60)
    yield c
    c.close()


def scrape(mesh, process: str) -> dict:
    return parse(httpx.get(f"http://127.0.0.1:{mesh.plan.metrics_ports[process]}/metrics", timeout=5).text)


def total(mesh, processes, name: str, suffix: str = "", **labels) -> float:
    return sum(value(scrape(mesh, p), name, suffix, **labels) for p in processes)


def long_prompt(i: int, tokens: int) -> str:
    """A prompt of about ``tokens`` tokens (each word is ~4) that shares no block with another ``i``'s."""
    return f"request {i}: " + " ".join(f"w{(i * 7919 + k) % 997}" for k in range(tokens // 4))


def ask(content: str, tokens: int, **extra) -> dict:
    return {"model": DEMO, "messages": [{"role": "user", "content": content}], "max_tokens": tokens, "seed": 5,
            **extra}


def test_prefill_and_decode_run_on_different_workers_and_the_decode_worker_caches_the_prompt(disagg_mesh, client):
    body = ask(long_prompt(1, 1200), 20)
    decode = list(DECODE)
    prompt_before = total(disagg_mesh, decode, "meshfront_worker_prompt_tokens", "_total")
    cached_before = total(disagg_mesh, decode, "meshfront_worker_cached_prompt_tokens", "_total")
    r = client.chat.completions.create(**body, extra_body={"nvext": {"extra_fields": ["worker_id", "timing"]}})
    workers = r.model_extra["nvext"]["worker_id"]
    assert workers["prefill_worker_id"] in PREFILL.values() and workers["decode_worker_id"] in DECODE.values()
    assert r.model_extra["nvext"]["timing"]["kv_transfer_ms"] > 0
    assert r.usage.completion_tokens == 20
    # The decode leg's prompt (the prompt and the first token) was cached on its worker but for the tail.
    prompt = total(disagg_mesh, decode, "meshfront_worker_prompt_tokens", "_total") - prompt_before
    cached = total(disagg_mesh, decode, "meshfront_worker_cached_prompt_tokens", "_total") - cached_before
    assert prompt == r.usage.prompt_tokens + 1 and cached >= 16 * (r.usage.prompt_tokens // 16) > 0.95 * prompt
    # The same prompt run whole on that decode worker (pinned) finds every full block of it cached there,
    # although that worker never computed it: the transfer brought it. It answers token for token the same.
    pinned = client.chat.completions.create(**body, extra_headers={"x-worker-instance-id": workers["decode_worker_id"]})
    prompt = pinned.usage.prompt_tokens
    assert pinned.usage.prompt_tokens_details.cached_tokens >= 16 * ((prompt - 1) // 16) > 0
    assert pinned.choices[0].message.content == r.choices[0].message.content


def test_prefill_workers_never_decode_more_than_one_token(disagg_mesh, client):
    prefill = list(PREFILL)
    tokens = total(disagg_mesh, prefill, "meshfront_worker_output_tokens", "_total")
    sequences = total(disagg_mesh, prefill, "meshfront_worker_requests", "_total", outcome="finished")
    bodies = [ask(long_prompt(100 + i, 800), 30) for i in range(6)]
    results = asyncio.run(run_streams(disagg_mesh.url, bodies))
    assert all(r.done and not r.error for r in results)
    new_sequences = total(disagg_mesh, prefill, "meshfront_worker_requests", "_total", outcome="finished") - sequences
    assert new_sequences == 6  # every request had its prefill leg there ...
    assert total(disagg_mesh, prefill, "meshfront_worker_output_tokens", "_total") - tokens == 6  # ... of one token
    assert total(disagg_mesh, list(DECODE), "meshfront_worker_kv_transfers", "_total", outcome="received") >= 6


def test_stream_and_non_stream_and_aggregated_answers_are_identical(disagg_mesh, client):
    body = ask(long_prompt(7, 500), 60)
    whole = client.chat.completions.create(**body)
    chunks = list(client.chat.completions.create(**body, stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content and whole.usage.completion_tokens == 60
    assert chunks[-1].usage.completion_tokens == 60 and chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    aggregated = client.chat.completions.create(**body, extra_headers={"x-worker-instance-id": "decode-1"})
    assert aggregated.choices[0].message.content == whole.choices[0].message.content


def hang_up(port: int, body: dict, *, frames: int = 0, after_s: float = 0.0) -> datetime.datetime:
    """Streams ``body`` over a raw socket and resets it after ``frames`` SSE frames and ``after_s`` seconds
    (what a killed client does); returns when it left, to compare with the workers' log times."""
    payload = orjson.dumps({**body, "stream": True})
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  b"content-length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        seen = b""
        while seen.count(b"data: ") < frames:
            chunk = s.recv(65536)
            assert chunk, "stream ended early"
            seen += chunk
        time.sleep(after_s)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST now
    return datetime.datetime.now()


def wait_all_free(mesh, within_s: float) -> float:
    """Seconds until no worker runs a sequence or holds blocks for a transfer."""
    start = time.monotonic()
    workers = [*PREFILL, *DECODE]
    while True:
        scraped = {p: scrape(mesh, p) for p in workers}
        busy = {p: (value(m, "meshfront_worker_inflight_requests"),
                    value(m, "meshfront_worker_kv_transfer_held_blocks")) for p, m in scraped.items()}
        if not any(a or b for a, b in busy.values()):
            return time.monotonic() - start
        assert time.monotonic() - start < within_s, busy
        time.sleep(0.02)


ABORTED = {"prefill": "aborted by the caller after 0 tokens", "decode": r"aborted by the caller after [1-9]"}
RELEASED = "released: its decode leg will not come"


def logged(mesh, processes, pattern: str) -> list[datetime.datetime]:
    """When the workers of ``processes`` logged a line matching ``pattern``."""
    return sorted(datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
                  for p in processes for line in mesh.full_log(p).splitlines() if re.search(pattern, line))


@pytest.mark.parametrize(("phase", "frames", "after_s"), [
    ("prefill", 0, 0.3),  # a 3000-token prompt prefills for ~0.5 s
    ("transfer", 1, 0.1),  # the first token is out; ~190 blocks of 20 MB at 2 GB/s take seconds
    ("decode", 8, 0.0),
])
def test_a_client_hanging_up_frees_both_workers(disagg_mesh, phase, frames, after_s):
    wait_all_free(disagg_mesh, 10)
    prefill, decode = list(PREFILL), list(DECODE)
    # Which worker must have aborted what: the prefill worker mid-prefill, or the decode worker before its
    # first token (mid-pull or mid-transfer) or after it.
    where, when = {"prefill": (prefill, "prefill"), "transfer": (decode, "prefill"),
                   "decode": (decode, "decode")}[phase]
    aborted, released = len(logged(disagg_mesh, where, ABORTED[when])), len(logged(disagg_mesh, prefill, RELEASED))
    held = total(disagg_mesh, prefill, "meshfront_worker_kv_transfers", "_total")
    left = hang_up(disagg_mesh.plan.http_port, ask(long_prompt(300 + frames, 250 if phase == "decode" else 3000), 500),
                   frames=frames, after_s=after_s)
    wait_all_free(disagg_mesh, 2.0)  # nothing runs and nothing is held (each poll scrapes four workers)
    stamps = wait_until(lambda: logged(disagg_mesh, where, ABORTED[when])[aborted:], 2, f"the abort in the {phase}")
    lags = {"abort": (stamps[-1] - left).total_seconds()}
    # The prefill's held blocks were pulled or released (never left to time out), or never held at all; a
    # release (the decode leg had not pulled yet) is as prompt as the abort.
    assert total(disagg_mesh, prefill, "meshfront_worker_kv_transfers", "_total") == held + (phase != "prefill")
    if releases := logged(disagg_mesh, prefill, RELEASED)[released:]:
        lags["release"] = (releases[-1] - left).total_seconds()
    print(f"{phase}: freed after the hang-up in", {k: f"{v * 1000:.0f} ms" for k, v in lags.items()})
    assert max(lags.values()) < 0.2, lags


def _kill_when_streaming(mesh, name: str, wait_for_tokens: bool):
    async def during(events):
        if wait_for_tokens:
            await asyncio.gather(*(e.wait() for e in events))
        else:
            await asyncio.sleep(0.4)
        mesh.kill(name)
    return during


def wait_registered(mesh, worker_ids, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        live = set()
        for line in mesh.full_log("gateway-0").splitlines():
            for w in worker_ids:
                if f"worker {w} serves" in line:
                    live.add(w)
                elif f"worker {w} left" in line:
                    live.discard(w)
        if live == set(worker_ids):
            return
        time.sleep(0.2)
    raise AssertionError(f"{worker_ids} not registered again")


def test_a_killed_decode_worker_loses_no_stream(disagg_mesh):
    bodies = [chat(DEMO, i, 150) for i in range(16)]
    reference = asyncio.run(run_streams(disagg_mesh.url, bodies))
    assert all(r.done and not r.error for r in reference)
    before = disagg_mesh.full_log("postprocessor").count(" migrates from decode-")
    killed: list[str] = []

    async def kill_the_busier_decode_worker(events):
        await asyncio.gather(*(e.wait() for e in events))  # every stream has its first token: decode legs run
        running = {p: value(scrape(disagg_mesh, p), "meshfront_worker_inflight_requests") for p in DECODE}
        killed.append(max(running, key=running.__getitem__))
        assert running[killed[0]] > 0, running
        disagg_mesh.kill(killed[0])

    try:
        disturbed = asyncio.run(run_streams(disagg_mesh.url, bodies, kill_the_busier_decode_worker))
    finally:
        for name in killed:
            disagg_mesh.restart(name)
    assert [(r.done, r.error) for r in disturbed] == [(True, None)] * len(bodies)
    assert [r.text for r in disturbed] == [r.text for r in reference]
    assert disagg_mesh.full_log("postprocessor").count(" migrates from decode-") > before
    wait_registered(disagg_mesh, list(DECODE.values()))


def test_a_killed_prefill_worker_loses_no_stream(disagg_mesh):
    bodies = [ask(long_prompt(500 + i, 1400), 20) for i in range(8)]
    # The reference runs whole on a decode worker, so that the prefill workers have none of these prompts
    # cached and the kill lands while they prefill.
    reference = asyncio.run(run_streams(disagg_mesh.url, [{**b, "nvext": {"backend_instance_id": "decode-1"}}
                                                          for b in bodies]))
    assert all(r.done and not r.error for r in reference)
    log_before = len(disagg_mesh.full_log("postprocessor"))
    try:
        disturbed = asyncio.run(run_streams(disagg_mesh.url, bodies, _kill_when_streaming(disagg_mesh, "mocker-0",
                                                                                          False)))
    finally:
        disagg_mesh.restart("mocker-0")
    assert [(r.done, r.error) for r in disturbed] == [(True, None)] * len(bodies)
    assert [r.text for r in disturbed] == [r.text for r in reference]
    assert " migrates from prefill-0" in disagg_mesh.full_log("postprocessor")[log_before:], "the kill hit no leg"
    wait_registered(disagg_mesh, list(PREFILL.values()))


def test_the_all_in_one_shape_runs_the_same_two_legs(disagg_mesh, client, tmp_path_factory, demo_model_dir):
    """`meshfront run --inproc`: the gateway, router and postprocessor in one process run the same legs, and
    answer as the split mesh does (stream and non-stream)."""
    body = ask(long_prompt(900, 600), 40)
    split = client.chat.completions.create(**body)
    inproc = start_mesh(tmp_path_factory, [spec(demo_model_dir, "prefill", "prefill-9"),
                                           spec(demo_model_dir, "decode", "decode-9")], router_mode="kv", inproc=True)
    try:
        with sdk_client(inproc, timeout=60) as one:
            r = one.chat.completions.create(**body, extra_body={"nvext": {"extra_fields": ["worker_id", "timing"]}})
            assert r.model_extra["nvext"]["worker_id"] == {"prefill_worker_id": "prefill-9",
                                                          "decode_worker_id": "decode-9"}
            assert r.model_extra["nvext"]["timing"]["kv_transfer_ms"] > 0
            assert r.choices[0].message.content == split.choices[0].message.content
            chunks = list(one.chat.completions.create(**body, stream=True))
            assert "".join(c.choices[0].delta.content or "" for c in chunks) == split.choices[0].message.content
    finally:
        stop_cleanly(inproc)


def test_a_burst_of_split_requests_spreads_over_both_decode_workers(disagg_mesh):
    """Eight long prompts sent at once are all routed before any finishes: their decode legs share the decode
    pool (each booking counts toward its worker's decode load at once), not all land on one worker."""
    wait_all_free(disagg_mesh, 10)
    bodies = [{**ask(long_prompt(300 + i, 1500), 40), "nvext": {"extra_fields": ["worker_id"]}} for i in range(8)]

    async def send() -> list[dict]:
        async with httpx.AsyncClient(base_url=disagg_mesh.url, timeout=60) as http:
            replies = await asyncio.gather(*(http.post("/v1/chat/completions", json=b) for b in bodies))
        return [r.raise_for_status().json() for r in replies]

    decode = [r["nvext"]["worker_id"]["decode_worker_id"] for r in asyncio.run(send())]
    assert sorted(decode.count(w) for w in DECODE.values()) == [4, 4], decode
