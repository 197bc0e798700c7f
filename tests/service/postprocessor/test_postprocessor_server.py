"""PostprocessorService over real gRPC: text, finish reasons, usage, coalescing, cancellation, failures."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import uuid

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from meshfront.common.v1 import common_pb2
from meshfront.postprocessor.v1 import postprocessor_pb2
from meshfront.worker.v1 import worker_pb2
from tokenizers import Tokenizer

from services.common.errors import InvalidRequest
from services.models.qwen import EOS_TOKEN_IDS
from tests.service.postprocessor.fake_worker import Fail, Forever

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]

EOS, LENGTH, STOP = common_pb2.FINISH_REASON_EOS, common_pb2.FINISH_REASON_LENGTH, common_pb2.FINISH_REASON_STOP


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir):
    return Tokenizer.from_file(str(demo_model_dir / "tokenizer.json"))


@pytest.fixture
def make_request(demo_model_dir, fake_worker):
    def make(stop=(), address=None):
        req = postprocessor_pb2.GenerateRequest(worker_address=address or fake_worker[1])
        req.options.model_dir = str(demo_model_dir)
        req.request.request_id = uuid.uuid4().hex
        req.request.token_ids.extend([151644, 77091, 198])  # <|im_start|>assistant\n
        req.request.stop.stop.extend(stop)
        req.request.stop.stop_token_ids_hidden.extend(EOS_TOKEN_IDS)
        return req
    return make


def ids_of(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False).ids


def msg(ids=(), finish=0, cached=0, prompt=0):
    return worker_pb2.GenerateResponse(token_ids=list(ids), finish_reason=finish, cached_tokens=cached,
                                       prompt_tokens=prompt)


def error_reason(e: grpc.aio.AioRpcError) -> str | None:
    for key, value in e.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            info = error_details_pb2.ErrorInfo()
            status_pb2.Status.FromString(value).details[0].Unpack(info)
            return info.reason
    return None


async def test_text_finish_reason_usage_and_coalescing(postprocessor_stub, fake_worker, make_request, tokenizer):
    worker, _ = fake_worker
    req = make_request()
    text = "Streaming 🤖 text, 你好世界, in multi-token chunks."
    ids = ids_of(tokenizer, text)
    worker.script(req.request.request_id, [
        msg(ids[:5], cached=16, prompt=3), msg(ids[5:10]), msg(ids[10:] + [EOS_TOKEN_IDS[0]], EOS)])
    responses = [r async for r in postprocessor_stub.Generate(req)]
    assert "".join(r.text for r in responses) == text
    assert len(responses) <= 3 < len(ids)  # at most one response per worker message
    assert [r.finish_reason for r in responses][-1] == EOS
    assert all(r.finish_reason == 0 for r in responses[:-1])
    assert sum(r.completion_tokens for r in responses) == len(ids) + 1  # the hidden EOS counts
    assert (responses[0].cached_tokens, responses[0].prompt_tokens) == (16, 3)
    assert worker.received[-1].request.request_id == req.request.request_id


@pytest.mark.parametrize("interval", [1, 8, 1000])
async def test_stream_interval_gathers_tokens_and_keeps_the_text(postprocessor_stub, fake_worker, make_request,
                                                                 tokenizer, interval):
    """One token per worker message (a paced engine): the first goes at once, then every ``interval``."""
    worker, _ = fake_worker
    req = make_request()
    req.options.stream_interval = interval
    text = "One token per engine step, gathered into fewer responses."
    ids = ids_of(tokenizer, text)
    steps = [msg([i], prompt=3 if k == 0 else 0) for k, i in enumerate(ids)]
    # The worker paces its steps, so each one reaches the postprocessor as its own message.
    worker.script(req.request.request_id,
                  [x for step in steps for x in (step, 0.005)] + [msg([EOS_TOKEN_IDS[0]], EOS)])
    responses = [r async for r in postprocessor_stub.Generate(req)]
    assert "".join(r.text for r in responses) == text
    assert responses[0].prompt_tokens == 3
    assert responses[0].completion_tokens < max(interval, 2)  # the first response is never held back
    assert responses[-1].finish_reason == EOS
    assert sum(r.completion_tokens for r in responses) == len(ids) + 1
    if interval == 1:
        assert len(responses) >= len(ids) // 2  # about one response per step
    else:
        # Every response between the first and the last carries at least ``interval`` tokens.
        assert all(r.completion_tokens >= interval for r in responses[1:-1])
        assert len(responses) <= 2 + len(ids) // interval


async def test_length_finish_passes_through(postprocessor_stub, fake_worker, make_request, tokenizer):
    worker, _ = fake_worker
    req = make_request()
    worker.script(req.request.request_id, [msg(ids_of(tokenizer, "cut short"), LENGTH)])
    responses = [r async for r in postprocessor_stub.Generate(req)]
    assert [(r.text, r.finish_reason) for r in responses] == [("cut short", LENGTH)]


async def test_stop_string_ends_the_stream_and_cancels_the_worker(postprocessor_stub, fake_worker, make_request,
                                                                  tokenizer):
    worker, _ = fake_worker
    req = make_request(stop=["</answer>"])
    ids = ids_of(tokenizer, "<answer>42</answer> and then more")
    cancelled = worker.script(req.request.request_id, [msg(ids[:3]), msg(ids[3:]), Forever(msg([11]), 0.05)])
    responses = [r async for r in postprocessor_stub.Generate(req)]
    assert "".join(r.text for r in responses) == "<answer>42"
    assert (responses[-1].finish_reason, responses[-1].stop_reason) == (STOP, "</answer>")
    await asyncio.wait_for(cancelled.wait(), 5)


async def test_client_cancel_cancels_the_worker_call(postprocessor_stub, fake_worker, make_request, tokenizer):
    worker, _ = fake_worker
    req = make_request()
    cancelled = worker.script(req.request.request_id, [msg(ids_of(tokenizer, "hello")), Forever(msg([11]), 0.05)])
    call = postprocessor_stub.Generate(req)
    first = await call.read()
    assert first.text == "hello"
    call.cancel()
    await asyncio.wait_for(cancelled.wait(), 5)


async def test_worker_unavailable_before_tokens(postprocessor_stub, fake_worker, make_request):
    worker, _ = fake_worker
    req = make_request()
    worker.script(req.request.request_id, [Fail(grpc.StatusCode.UNAVAILABLE)])
    with pytest.raises(grpc.aio.AioRpcError) as info:
        [r async for r in postprocessor_stub.Generate(req)]
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert error_reason(info.value) == "WORKER_FAILED"


async def test_worker_failure_after_tokens(postprocessor_stub, fake_worker, make_request, tokenizer):
    worker, _ = fake_worker
    req = make_request()
    worker.script(req.request.request_id, [msg(ids_of(tokenizer, "partial")), 0.05, Fail(grpc.StatusCode.INTERNAL)])
    call = postprocessor_stub.Generate(req)
    assert (await call.read()).text == "partial"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.read()
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert error_reason(info.value) == "WORKER_FAILED"


async def test_unreachable_worker_is_worker_failed(postprocessor_stub, make_request):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        [r async for r in postprocessor_stub.Generate(make_request(address=address))]
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert error_reason(info.value) == "WORKER_FAILED"


async def test_worker_rejection_keeps_its_reason(postprocessor_stub, fake_worker, make_request):
    worker, _ = fake_worker
    req = make_request()
    worker.script(req.request.request_id, [Fail(error=InvalidRequest("prompt too long", param="messages"))])
    with pytest.raises(grpc.aio.AioRpcError) as info:
        [r async for r in postprocessor_stub.Generate(req)]
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_reason(info.value) == "INVALID_REQUEST"


async def test_requests_to_one_worker_share_a_connection(postprocessor_stub, fake_worker, make_request, tokenizer):
    worker, _ = fake_worker
    for _ in range(3):
        req = make_request()
        worker.script(req.request.request_id, [msg(ids_of(tokenizer, "x"), LENGTH)])
        [r async for r in postprocessor_stub.Generate(req)]
    assert len(set(worker.peers[-3:])) == 1


def test_main_serves_and_drains_on_sigterm():
    proc = subprocess.Popen([sys.executable, "-m", "services.postprocessor", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "MESHFRONT_POSTPROCESSOR_DRAIN_GRACE_S": "1"})
    try:
        line = proc.stdout.readline()
        assert line.startswith("READY postprocessor 127.0.0.1:"), line
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
