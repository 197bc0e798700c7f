"""GenerateStream on a real mocker server: many sequences per stream, fewer messages than tokens, cancels."""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest
from meshfront.common.v1 import common_pb2
from meshfront.worker.v1 import worker_pb2

from services.common.errors import Draining, InvalidRequest, from_status_proto

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]


def generate_request(prompt, rid: str, **stop) -> worker_pb2.GenerateRequest:
    return worker_pb2.GenerateRequest(request=common_pb2.PreprocessedRequest(
        request_id=rid, model="demo", token_ids=list(prompt), eos_token_ids=[151645, 151643],
        stop=common_pb2.StopConditions(ignore_eos=True, **stop)))


def start(seq_id: int, request: worker_pb2.GenerateRequest) -> worker_pb2.GenerateStreamRequest:
    return worker_pb2.GenerateStreamRequest(start=worker_pb2.GenerateStreamStart(id=seq_id, request=request))


def cancel(seq_id: int) -> worker_pb2.GenerateStreamRequest:
    return worker_pb2.GenerateStreamRequest(cancel=worker_pb2.GenerateStreamCancel(id=seq_id))


async def unary_tokens(stub, request) -> list[int]:
    return [t async for m in stub.Generate(request) for t in m.token_ids]


async def wait_until(condition, seconds: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.01)


async def test_concurrent_sequences_share_messages_and_get_their_exact_tokens(start_mocker):
    worker = await start_mocker("--speedup-ratio", "10")
    requests = {i: generate_request(range(100 * i, 100 * i + 40), f"r{i}", max_tokens=16) for i in range(1, 9)}
    expected = {i: await unary_tokens(worker.stub, r) for i, r in requests.items()}
    call = worker.stub.GenerateStream()
    for i, r in requests.items():
        await call.write(start(i, r))
    got: dict[int, list[int]] = {i: [] for i in requests}
    finished: dict[int, int] = {}
    messages = 0
    while len(finished) < len(requests):
        message = await asyncio.wait_for(call.read(), 10)
        messages += 1
        for chunk in message.chunks:
            assert chunk.id not in finished and not chunk.HasField("error")
            got[chunk.id].extend(chunk.response.token_ids)
            if chunk.response.finish_reason:
                finished[chunk.id] = chunk.response.finish_reason
    await call.done_writing()
    assert got == expected
    assert set(finished.values()) == {common_pb2.FINISH_REASON_LENGTH}
    tokens = sum(len(t) for t in got.values())
    print(f"{tokens} tokens in {messages} messages")
    assert messages < tokens / 4, (messages, tokens)  # one message per engine step, not per token


async def test_cancel_aborts_only_that_sequence_and_frees_its_blocks(start_mocker, caplog):
    worker = await start_mocker("--speedup-ratio", "2")
    call = worker.stub.GenerateStream()
    await call.write(start(1, generate_request(range(200), "long", max_tokens=3000)))
    await call.write(start(2, generate_request(range(500, 540), "short", max_tokens=40)))
    seen: set[int] = set()
    while seen != {1, 2}:
        seen.update(c.id for c in (await asyncio.wait_for(call.read(), 10)).chunks)
    with_both = worker.engine.cache.active_blocks
    caplog.set_level(logging.INFO, logger="services.workers.service")
    await call.write(cancel(1))
    short_tokens, finish = 0, 0
    while not finish:
        for chunk in (await asyncio.wait_for(call.read(), 10)).chunks:
            if chunk.id == 2:
                short_tokens += len(chunk.response.token_ids)
                finish = chunk.response.finish_reason
    assert finish == common_pb2.FINISH_REASON_LENGTH and short_tokens > 0
    assert any("request long aborted by the caller" in r.getMessage() for r in caplog.records)
    assert not any("request short aborted" in r.getMessage() for r in caplog.records)
    await wait_until(lambda: worker.engine.cache.active_blocks == 0, 5, "the cancelled sequence kept its blocks")
    assert with_both > 0
    await call.done_writing()  # half-closed with nothing running: the worker ends the stream cleanly
    while (message := await asyncio.wait_for(call.read(), 5)) is not grpc.aio.EOF:
        assert all(c.id == 1 for c in message.chunks)  # at most what was in flight before the cancel
    assert await call.code() == grpc.StatusCode.OK


async def test_ending_the_stream_aborts_every_sequence(start_mocker):
    worker = await start_mocker("--speedup-ratio", "1")
    call = worker.stub.GenerateStream()
    for i in (1, 2, 3):
        await call.write(start(i, generate_request(range(100 * i, 100 * i + 80), f"r{i}", max_tokens=3000)))
    seen: set[int] = set()
    while seen != {1, 2, 3}:
        seen.update(c.id for c in (await asyncio.wait_for(call.read(), 10)).chunks)
    assert worker.engine.cache.active_blocks > 0
    call.cancel()  # the postprocessor went away
    await wait_until(lambda: worker.engine.cache.active_blocks == 0 and not worker.engine.scheduler.has_work(), 5,
                     "sequences outlived their stream")


async def test_a_duplicate_id_and_an_invalid_request_fail_only_their_sequence(start_mocker):
    worker = await start_mocker("--speedup-ratio", "0")
    call = worker.stub.GenerateStream()
    await call.write(start(1, generate_request(range(40), "slow", max_tokens=64)))
    await call.write(start(1, generate_request(range(40), "dup", max_tokens=4)))
    await call.write(start(2, generate_request([], "empty", max_tokens=4)))
    errors: dict[int, Exception] = {}
    finished = False
    while not (finished and len(errors) == 2):
        for chunk in (await asyncio.wait_for(call.read(), 10)).chunks:
            if chunk.HasField("error"):
                errors.setdefault(chunk.id, from_status_proto(chunk.error))
            elif chunk.response.finish_reason:
                finished = True
    assert isinstance(errors[1], InvalidRequest) and "already running" in errors[1].message
    assert isinstance(errors[2], InvalidRequest)
    call.cancel()


async def test_a_draining_worker_finishes_running_sequences_refuses_new_ones_and_ends_the_stream(start_mocker):
    """SIGTERM's path (GrpcServer.stop): drain hooks, then a graceful stop that needs no grace period."""
    worker = await start_mocker("--speedup-ratio", "1")  # paced: the sequence is still running at the drain
    running = generate_request(range(40), "running", max_tokens=48)
    expected = await unary_tokens(worker.stub, running)
    call = worker.stub.GenerateStream()
    await call.write(start(1, running))
    got = [t for c in (await asyncio.wait_for(call.read(), 10)).chunks for t in c.response.token_ids]
    worker.server.grace_s = 60
    stopping = asyncio.create_task(worker.server.stop())
    await asyncio.sleep(0.05)
    await call.write(start(2, generate_request(range(40), "late", max_tokens=4)))
    refused = None
    while (message := await asyncio.wait_for(call.read(), 10)) is not grpc.aio.EOF:
        for chunk in message.chunks:
            if chunk.id == 2:
                refused = from_status_proto(chunk.error)
            else:
                got.extend(chunk.response.token_ids)
    assert got == expected  # the running sequence finished on the draining worker
    # DRAINING on the wire; the postprocessor's MuxWorkerClient makes it a WorkerFailed, so the request migrates.
    assert isinstance(refused, Draining) and "draining" in refused.message
    await asyncio.wait_for(stopping, 10)  # the stream ended with its work: the 60 s grace was not waited out
