"""The Batch API through Envoy with the unmodified openai SDK, on two gateways: a 1,000-line chat batch and an
embeddings batch (the real all-MiniLM-L6-v2 worker) complete with exact counts and one output line per input
line; bad lines and refused requests go to the error file; a cancel cancels; a gateway SIGKILLed in the middle
of a batch loses and repeats no line (the other gateway takes the batch over), and one that outlives a restart of NATS.

Two chat models: the demo model at speedup 0 (no simulated delays: the 1,000 lines take seconds) and a slow
one (real-time timing), whose batches run long enough to cancel or to kill their gateway in the middle.
"""

from __future__ import annotations

import io
import signal
import time

import openai
import orjson
import pytest

from services.launcher.plan import WorkerSpec
from services.models.minilm import default_embedding_model_dir
from tests.conftest import sdk_client, stop_cleanly
from tests.mesh.conftest import DEMO, mocker, start_mesh, wait_until

pytestmark = [pytest.mark.mesh, pytest.mark.timeout(300)]

SLOW = "test/slow"
EMBED = "sentence-transformers/all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def bmesh(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    m = start_mesh(tmp_path_factory, [mocker(demo_model_dir, DEMO, "0"), mocker(demo_model_dir, DEMO, "0"),
                                      mocker(demo_model_dir, SLOW, "1"),
                                      WorkerSpec(str(default_embedding_model_dir()), EMBED, "embed")],
                   gateways=2)
    yield m
    stop_cleanly(m)


@pytest.fixture
def client(bmesh):
    c = sdk_client(bmesh, timeout=60)
    yield c
    c.close()


def chat_line(custom_id: str, model: str = DEMO, max_tokens: int = 8) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "max_tokens": max_tokens,
                     "messages": [{"role": "user", "content": f"Hi number {custom_id}"}]}}


def upload(client, lines: list) -> str:
    data = b"\n".join(x if isinstance(x, bytes) else orjson.dumps(x) for x in lines) + b"\n"
    f = client.files.create(file=("input.jsonl", io.BytesIO(data)), purpose="batch")
    assert f.purpose == "batch" and f.bytes == len(data) and f.id.startswith("file-")
    assert client.files.content(f.id).read() == data
    return f.id


def run_batch(client, lines: list, endpoint: str = "/v1/chat/completions"):
    return client.batches.create(input_file_id=upload(client, lines), endpoint=endpoint, completion_window="24h")


def poll(client, batch_id: str, timeout: float, check=lambda b: None):
    """Polls until the batch is final; ``check`` sees every state on the way."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        b = _retrieve(client, batch_id)
        if b is not None:
            check(b)
            if b.status in ("completed", "failed", "expired", "cancelled"):
                return b
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} did not finish in {timeout} s")


def _retrieve(client, batch_id):
    try:
        return client.batches.retrieve(batch_id)
    except (openai.APIConnectionError, openai.InternalServerError):
        return None  # Envoy still sending some requests to a dead gateway


def jsonl(client, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [orjson.loads(x) for x in client.files.content(file_id).read().splitlines()]


def test_a_thousand_line_chat_batch(client):
    lines = [chat_line(f"req-{i}") for i in range(1000)]
    batch = run_batch(client, lines)
    assert batch.status == "validating" and batch.endpoint == "/v1/chat/completions"
    seen: list[tuple[int, int]] = []

    def counts_stay_right(b):
        c = b.request_counts
        if c is not None and c.total:
            assert c.total == 1000 and c.completed + c.failed <= 1000, c
            seen.append((c.completed, c.failed))

    started = time.monotonic()
    done = poll(client, batch.id, 120, counts_stay_right)
    assert done.status == "completed", done
    assert done.request_counts.total == 1000 and done.request_counts.completed == 1000
    assert done.request_counts.failed == 0 and done.error_file_id is None
    assert seen == sorted(seen)  # counts only grow
    assert done.in_progress_at and done.finalizing_at and done.completed_at >= done.created_at
    out = jsonl(client, done.output_file_id)
    assert [o["custom_id"] for o in out] == [f"req-{i}" for i in range(1000)]  # one line each, in input order
    assert all(o["response"]["status_code"] == 200 and o["response"]["body"]["object"] == "chat.completion"
               for o in out)
    assert out[0]["response"]["body"]["usage"]["completion_tokens"] > 0
    print(f"1000 lines in {time.monotonic() - started:.1f} s")
    assert client.batches.retrieve(batch.id).output_file_id in {f.id for f in client.files.list()}
    assert batch.id in {b.id for b in client.batches.list(limit=100)}


def test_bad_lines_and_refused_requests_go_to_the_error_file(client):
    lines = [chat_line("good"), b"{not json", chat_line("unknown-model", model="no/such-model"),
             {**chat_line("wrong-url"), "url": "/v1/completions"}, chat_line("good"),
             {**chat_line("bad-field"), "body": {"model": DEMO, "messages": [], "temperature": "hot"}}]
    done = poll(client, run_batch(client, lines).id, 60)
    assert done.status == "completed", done
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (6, 1, 5)
    out, err = jsonl(client, done.output_file_id), jsonl(client, done.error_file_id)
    assert [o["custom_id"] for o in out] == ["good"]
    by_id = {e["custom_id"]: e for e in err}
    assert len(err) == 5 and by_id[None]["error"]["code"] == "invalid_json"
    assert by_id["good"]["error"]["code"] == "duplicate_custom_id"
    assert by_id["wrong-url"]["error"]["code"] == "mismatched_url"
    refused = by_id["unknown-model"]["response"]
    assert refused["status_code"] == 404 and refused["body"]["error"]["code"] == "model_not_found"
    assert by_id["bad-field"]["response"]["status_code"] == 400


def test_an_embeddings_batch(client):
    texts = [f"sentence number {i} about guitars" for i in range(40)]
    lines = [{"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": EMBED, "input": t}} for i, t in enumerate(texts)]
    done = poll(client, run_batch(client, lines, "/v1/embeddings").id, 120)
    assert done.status == "completed" and done.request_counts.completed == 40 and done.request_counts.failed == 0
    out = jsonl(client, done.output_file_id)
    assert [o["custom_id"] for o in out] == [f"e{i}" for i in range(40)]
    direct = client.embeddings.create(model=EMBED, input=texts[7], encoding_format="float").data[0].embedding
    vector = out[7]["response"]["body"]["data"][0]["embedding"]
    assert len(vector) == 384 and max(abs(a - b) for a, b in zip(vector, direct, strict=True)) < 1e-5


def test_a_cancel_cancels(client):
    lines = [chat_line(f"c{i}", model=SLOW, max_tokens=40) for i in range(400)]
    batch = run_batch(client, lines)
    wait_until(lambda: (b := client.batches.retrieve(batch.id)).request_counts
               and b.request_counts.completed >= 5, 60, "lines to complete")
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    done = poll(client, batch.id, 60)
    assert done.status == "cancelled" and done.cancelled_at, done
    completed = done.request_counts.completed
    assert 5 <= completed < 400 and done.request_counts.failed == 0
    out, err = jsonl(client, done.output_file_id), jsonl(client, done.error_file_id)
    assert len(out) == completed and len(err) == 400 - completed  # every line once, in one file or the other
    assert {e["error"]["code"] for e in err} == {"batch_cancelled"}
    assert {o["custom_id"] for o in out} | {e["custom_id"] for e in err} == {f"c{i}" for i in range(400)}
    assert client.batches.cancel(batch.id).status == "cancelled"  # again: as it is
    finished = poll(client, run_batch(client, [chat_line("x")]).id, 30)
    with pytest.raises(openai.BadRequestError):
        client.batches.cancel(finished.id)  # nothing left to cancel


def test_a_gateway_killed_mid_batch_loses_and_repeats_no_line(bmesh, client):
    lines = [chat_line(f"k{i}", model=SLOW, max_tokens=20) for i in range(300)]
    batch = run_batch(client, lines)
    owner = wait_until(lambda: next((n for n in ("gateway-0", "gateway-1")
                                     if f"batch {batch.id} runs here" in bmesh.full_log(n)), None), 10, "its owner")
    wait_until(lambda: (b := client.batches.retrieve(batch.id)).request_counts
               and b.request_counts.completed >= 20, 60, "lines to complete")
    bmesh.kill(owner)
    other = "gateway-1" if owner == "gateway-0" else "gateway-0"
    try:
        done = poll(client, batch.id, 120)
        assert f"batch {batch.id} taken over" in bmesh.full_log(other)
    finally:
        bmesh.restart(owner)
        # Warmed up again before the mesh stops: a gateway stopped while it still connects logs its stages' closing.
        wait_until(lambda: bmesh.full_log(owner).count("gateway ready") >= 2, 60, "the restarted gateway")
    assert done.status == "completed", done
    assert done.request_counts.completed == 300 and done.request_counts.failed == 0
    out = jsonl(client, done.output_file_id)
    assert sorted(o["custom_id"] for o in out) == sorted(f"k{i}" for i in range(300))  # none lost, none twice
    assert done.error_file_id is None


def test_a_batch_survives_a_nats_restart(bmesh, client):
    """NATS (its JetStream on disk) goes away for 3 s in the middle of a batch: the lines that finish meanwhile
    wait in their gateway until NATS takes their record, and the batch completes with every line once."""
    lines = [chat_line(f"n{i}", model=SLOW, max_tokens=20) for i in range(200)]
    batch = run_batch(client, lines)
    wait_until(lambda: (b := client.batches.retrieve(batch.id)).request_counts
               and b.request_counts.completed >= 10, 60, "lines to complete")
    assert client.batches.retrieve(batch.id).status == "in_progress"
    bmesh.kill("nats", signal.SIGTERM)
    bmesh.procs["nats"].wait(5)
    time.sleep(3)
    bmesh.start_process(bmesh.specs["nats"])
    done = poll(client, batch.id, 120)
    assert done.status == "completed", done
    assert done.request_counts.completed == 200 and done.request_counts.failed == 0
    out = jsonl(client, done.output_file_id)
    assert sorted(o["custom_id"] for o in out) == sorted(f"n{i}" for i in range(200))
